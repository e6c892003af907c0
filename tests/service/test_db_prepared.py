"""Prepared statements (service.db.prepared): the same rows, types and errors as
``Connection.execute``, and a lost PostgreSQL connection still an outage (503), not a 500."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    bindparam,
    select,
    text,
)
from sqlalchemy import exc as sa_exc

from service.db import make_engine
from service.db.base import UTCDateTime
from service.db.prepared import Prepared
from tests.service.conftest import World, db_engine


def _table() -> Table:
    return Table(
        f"prep_{secrets.token_hex(4)}",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("name", String(20), nullable=False),
        Column("tags", JSON, nullable=True),
        Column("ok", Boolean, nullable=False),
        Column("score", Float, nullable=True),
        Column("times", Integer, nullable=False, default=1),
        Column("at", UTCDateTime, nullable=True),
        UniqueConstraint("name"),
    )


@pytest.fixture
def engine_table(backend: str) -> Iterator[tuple[Engine, Table]]:
    engine = make_engine(backend)
    table = _table()
    table.create(engine)
    try:
        yield engine, table
    finally:
        table.drop(engine)
        engine.dispose()


ALL = ("name", "tags", "ok", "score", "times", "at")


def test_rows_and_types_as_connection_execute_gives_them(
    engine_table: tuple[Engine, Table],
) -> None:
    engine, t = engine_table
    insert = Prepared(t.insert().returning(t.c.id), column_keys=ALL)
    at = datetime(2026, 3, 1, 12, 30, 5, 123456, tzinfo=UTC)
    by_name = Prepared(select(t).where(t.c.name == bindparam("name")))
    with engine.begin() as conn:
        rows = [
            {"name": "a", "tags": ["x", "é"], "ok": True, "score": 0.5, "times": 1, "at": at},
            {"name": "b", "tags": None, "ok": False, "score": None, "times": 2, "at": None},
        ]
        ids = [insert.execute(conn, row).scalar() for row in rows]
        assert all(isinstance(i, int) for i in ids) and ids[0] != ids[1]
        for name in ("a", "b"):
            mine = by_name.execute(conn, {"name": name}).first()
            theirs = conn.execute(by_name.stmt, {"name": name}).one()
            assert mine == tuple(theirs)
            assert mine is not None and mine.name == name and mine.id == theirs.id
        got = by_name.execute(conn, {"name": "a"}).first()
        assert got is not None
        assert got.at == at and got.at.tzinfo is not None  # UTCDateTime's processor ran
        assert got.tags == ["x", "é"] and got.ok is True
        assert by_name.execute(conn, {"name": "zz"}).first() is None
        assert by_name.execute(conn, {"name": "zz"}).scalar() is None
        with pytest.raises(AttributeError):
            _ = got.nope


def test_update_counts_rows_and_keeps_the_statements_own_literals(
    engine_table: tuple[Engine, Table],
) -> None:
    engine, t = engine_table
    insert = Prepared(t.insert(), column_keys=ALL)
    bump = Prepared(
        t.update()
        .where(t.c.name == bindparam("who"), t.c.times == bindparam("before"))
        .values(times=t.c.times + 1, at=bindparam("when"))
    )
    when = datetime.now(UTC)
    with engine.begin() as conn:
        insert.execute(conn, dict.fromkeys(ALL) | {"name": "a", "ok": True, "times": 1})
        assert bump.execute(conn, {"who": "a", "before": 1, "when": when}).rowcount == 1
        assert bump.execute(conn, {"who": "a", "before": 1, "when": when}).rowcount == 0
        row = conn.execute(select(t.c.times, t.c.at)).one()
    assert row.times == 2 and abs(row.at - when) < timedelta(milliseconds=1)


def test_driver_errors_are_sqlalchemys_and_the_transaction_rolls_back(
    engine_table: tuple[Engine, Table],
) -> None:
    engine, t = engine_table
    insert = Prepared(t.insert(), column_keys=ALL)
    row = dict.fromkeys(ALL) | {"name": "dup", "ok": True, "times": 1}
    with pytest.raises(sa_exc.IntegrityError), engine.begin() as conn:
        insert.execute(conn, row)
        insert.execute(conn, row)  # the unique name: the API's 409 path catches this class
    with engine.connect() as conn:
        assert conn.execute(select(t.c.id)).all() == []  # nothing of that transaction stayed
        with pytest.raises(ValueError, match="naive datetime"):  # a bind processor's refusal
            insert.execute(conn, row | {"at": datetime(2026, 1, 1)})


def test_one_cursor_per_connection_and_a_new_one_after_an_error(
    engine_table: tuple[Engine, Table],
) -> None:
    from service.db.prepared import _CURSOR

    engine, t = engine_table
    insert = Prepared(t.insert(), column_keys=ALL)
    names = Prepared(select(t.c.name).order_by(t.c.name))
    row = dict.fromkeys(ALL) | {"ok": True, "times": 1}
    with engine.begin() as conn:
        insert.execute(conn, row | {"name": "a"})
        kept = conn.connection.info[_CURSOR]
        insert.execute(conn, row | {"name": "b"})
        assert [r.name for r in names.execute(conn).rows] == ["a", "b"]
        assert conn.connection.info[_CURSOR] is kept  # the same cursor throughout
        assert kept[0] is conn.connection.dbapi_connection
    with pytest.raises(sa_exc.IntegrityError), engine.begin() as conn:
        insert.execute(conn, row | {"name": "a"})
    with engine.begin() as conn:  # the failed statement's cursor is not used again
        assert conn.connection.info.get(_CURSOR) is None
        insert.execute(conn, row | {"name": "c"})
        assert [r.name for r in names.execute(conn).rows] == ["a", "b", "c"]


def test_shapes_it_cannot_run_exactly_are_refused(engine_table: tuple[Engine, Table]) -> None:
    engine, t = engine_table
    # "times" left out: Connection.execute would fill in its default, a Prepared cannot
    without_times = Prepared(t.insert(), column_keys=("name", "ok"))
    by_name = Prepared(select(t.c.id).where(t.c.name == bindparam("name")))
    with engine.begin() as conn:
        with pytest.raises(ValueError, match="every column"):
            without_times.execute(conn, {"name": "a", "ok": True})
        with pytest.raises(ValueError, match="no value for"):
            by_name.execute(conn, {})


def _pooled_backend_pids(engine: Engine) -> list[int]:
    # the connections sitting in the app's pool, as the server knows them
    return [
        rec.dbapi_connection.info.backend_pid
        for rec in list(engine.pool._pool.queue)  # type: ignore[attr-defined]
        if rec.dbapi_connection is not None
    ]


def _kill(app: Flask, pids: list[int]) -> None:
    admin = make_engine(str(db_engine(app).url))
    try:
        with admin.connect() as conn:
            for pid in pids:
                conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    finally:
        admin.dispose()


@pytest.mark.postgres
def test_a_connection_lost_under_an_answer_is_a_503_then_recovers(world: World) -> None:
    if db_engine(world.app).dialect.name != "postgresql":
        pytest.skip("a server that drops connections: PostgreSQL")
    att = world.start("quiz-a")
    item = att["items"][0]
    answer: dict[str, Any] = {"item_id": item["id"], "answer": [item["options"][0]["id"]]}
    pids = _pooled_backend_pids(db_engine(world.app))
    assert pids
    _kill(world.app, pids)  # pooled and recently used: handed out without a ping
    url = f"/api/v1/attempts/{att['id']}/responses"
    r = world.post(url, "alice", json=answer)
    assert r.status_code == 503, r.get_json()
    assert r.headers["Retry-After"].isdigit() and r.get_json()["code"] == 503
    r = world.post(url, "alice", json=answer)  # the pool was invalidated: fresh connections
    assert r.status_code == 201, r.get_json()
    assert world.get(f"/api/v1/attempts/{att['id']}", "alice").get_json()["items"][0]["response"]
