"""The PostgreSQL pool: a connection that sat idle is tested before use, a busy one is not."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import text

from service import db as service_db
from service.db import make_engine


def _backend_pid(conn: Any) -> int:
    return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_idle_connection_killed_by_the_server_is_replaced(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(postgres_url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            old = _backend_pid(conn)
        with engine.connect() as conn:  # the same pooled connection, handed out untested
            assert _backend_pid(conn) == old
        other = make_engine(postgres_url)
        with other.connect() as admin:  # the server ends it, as a restart or failover would
            admin.execute(text("SELECT pg_terminate_backend(:p)"), {"p": old})
        other.dispose()
        monkeypatch.setattr(service_db, "PING_AFTER_IDLE_S", 0.0)  # it has sat "long enough"
        time.sleep(0.05)
        with engine.connect() as conn:  # no error: tested, found dead, replaced
            assert _backend_pid(conn) != old
    finally:
        engine.dispose()


def test_connection_in_steady_use_is_not_pinged(postgres_url: str) -> None:
    engine = make_engine(postgres_url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        calls: list[Any] = []
        real = engine.dialect.do_ping
        engine.dialect.do_ping = lambda c: calls.append(c) or real(c)  # type: ignore[method-assign]
        for _ in range(5):
            with engine.connect() as conn:
                conn.execute(text("SELECT 2"))
        assert calls == []  # checked in moments ago: no round trip before use
    finally:
        engine.dispose()
