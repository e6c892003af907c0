"""SQLite's writers queue on the ``<db>.writers`` file lock; readers never wait for them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from service.db import begin_writing, make_engine, write_intent


def _engine(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'w.sqlite3'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    return engine


def _second_writer(engine: Engine, started: threading.Event, done: list[float]) -> threading.Thread:
    def run() -> None:
        with write_intent(), Session(engine) as s:
            started.set()
            s.execute(text("INSERT INTO t VALUES (2)"))  # BEGIN IMMEDIATE: queues on the lock
            done.append(time.monotonic())
            s.commit()

    return threading.Thread(target=run)


def test_a_writer_waits_for_the_one_holding_the_lock_until_it_ends(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    try:
        for end in ("commit", "rollback"):
            with write_intent(), Session(engine) as first:
                first.execute(text("INSERT INTO t VALUES (1)"))  # holds the writers' lock
                started, done = threading.Event(), []
                second = _second_writer(engine, started, done)
                second.start()
                started.wait(5)
                time.sleep(0.3)
                assert done == [], "the second writer began while the first held the lock"
                ended = time.monotonic()
                getattr(first, end)()  # releases it
                second.join(5)
                assert done and done[0] >= ended and done[0] - ended < 1.0, (end, done)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM t")).scalar() == 3  # 1 rolled back
    finally:
        engine.dispose()


def test_readers_do_not_wait_for_a_writer(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    try:
        with write_intent(), Session(engine) as writer:
            writer.execute(text("INSERT INTO t VALUES (1)"))  # holds the writers' lock
            seen: list[int] = []

            def read() -> None:  # another request: no write intent in its context
                with Session(engine) as reader:  # WAL: the last committed state, at once
                    seen.append(reader.execute(text("SELECT count(*) FROM t")).scalar_one())

            t0 = time.monotonic()
            reader = threading.Thread(target=read)
            reader.start()
            reader.join(5)
            assert seen == [0] and time.monotonic() - t0 < 1.0
            writer.commit()
    finally:
        engine.dispose()


def test_begin_writing_turns_the_read_transaction_into_the_writing_one(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    try:
        with Session(engine) as s:
            s.execute(text("SELECT count(*) FROM t"))  # a read transaction, no lock
            dbapi = s.connection().connection.dbapi_connection
            assert begin_writing(s) is True  # what it read may have changed: check again
            assert s.connection().connection.dbapi_connection is dbapi  # same connection
            assert begin_writing(s) is False  # already writing
            s.execute(text("INSERT INTO t VALUES (1)"))
            started, done = threading.Event(), []
            second = _second_writer(engine, started, done)
            second.start()
            started.wait(5)
            time.sleep(0.3)
            assert done == []  # the upgraded transaction holds the writers' lock
            s.commit()
            second.join(5)
            assert done
    finally:
        engine.dispose()
