"""Database layer: SQLAlchemy 2 typed models on one ``Base``, engines for SQLite and PostgreSQL.

Extension point (for other features, e.g. the grader's ``service/db/submissions.py``): add a
module to this package that defines tables on ``service.db.base.Base``. ``load_models()``
imports every module here, so the tables reach ``Base.metadata`` (used by Alembic's
autogenerate, ``create_all`` in tests and the schema checks) without editing this file. Then add
an Alembic revision in ``service/migrations/versions/`` whose ``down_revision`` is the current
head (``kgrade db heads`` prints it).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

from service.db.base import Base, UTCDateTime, utcnow

# Set while a request or command is about to write. On SQLite the transaction then starts with
# BEGIN IMMEDIATE, taking the write lock up front: a deferred transaction that reads first and
# writes later fails with SQLITE_BUSY_SNAPSHOT when another process committed in between, which
# would surface as a 500 under concurrent submissions. PostgreSQL ignores it (row locks and
# advisory locks do that job there).
_write_intent: ContextVar[bool] = ContextVar("kgrade_write_intent", default=False)


@contextmanager
def write_intent() -> Iterator[None]:
    token = _write_intent.set(True)
    try:
        yield
    finally:
        _write_intent.reset(token)


def load_models() -> None:
    """Import every module of this package so all tables are registered on ``Base.metadata``."""
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")


def _setup_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" hook below issue BEGIN itself (pysqlite's own implicit
        # transaction handling cannot do BEGIN IMMEDIATE).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        # WAL lets readers (GET requests, other gunicorn workers) proceed during a write.
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if _write_intent.get() else "BEGIN")


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url`` with the settings kgrade needs on that backend."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)
        _setup_sqlite(engine)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


def is_postgres(engine_or_conn: Any) -> bool:
    return engine_or_conn.dialect.name == "postgresql"


def advisory_lock(session: Any, key: str) -> None:
    """Serialize writers of ``key`` until the transaction ends (a check-then-insert, such as an
    attempt limit, then holds under races). SQLite needs nothing: its writes already run under
    BEGIN IMMEDIATE (``write_intent``)."""
    if is_postgres(session.get_bind()):
        import hashlib

        from sqlalchemy import text

        digest = hashlib.sha256(key.encode()).digest()
        session.execute(
            text("SELECT pg_advisory_xact_lock(:k)"),
            {"k": int.from_bytes(digest[:8], "big", signed=True)},
        )


__all__ = [
    "Base",
    "UTCDateTime",
    "advisory_lock",
    "load_models",
    "make_engine",
    "utcnow",
    "write_intent",
]
