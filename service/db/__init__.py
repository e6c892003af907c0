"""Database layer: SQLAlchemy 2 typed models on one ``Base``, engines for SQLite and PostgreSQL.

Extension point (for other features, e.g. the grader's ``service/db/submissions.py``): add a
module to this package that defines tables on ``service.db.base.Base``. ``load_models()``
imports every module here, so the tables reach ``Base.metadata`` (used by Alembic's
autogenerate, ``create_all`` in tests and the schema checks) without editing this file. Then add
an Alembic revision in ``service/migrations/versions/`` whose ``down_revision`` is the current
head (``kgrade db heads`` prints it).
"""

from __future__ import annotations

import fcntl
import importlib
import os
import pkgutil
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Engine, bindparam, create_engine, event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError

from service.db.base import Base, UTCDateTime, utcnow
from service.db.prepared import Prepared

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


#: Connection-info key: whether the SQLite transaction under way began with the write lock.
_WRITING = "kgrade_writing"


def begin_writing(session: Any) -> bool:
    """Make the session's transaction one that may write, from here on; True when what it read
    before may have changed since (the caller checks it again, under the lock now held).

    SQLite: a transaction that began to read (no write intent) holds a snapshot that cannot
    become a write once another connection has committed, so on the same connection its
    snapshot ends (it must hold no unsaved changes) and a transaction with the write lock
    begins, unseen by SQLAlchemy, for which it is one transaction throughout (one pool checkout,
    one commit). Requests that read much and write a row (an answer) so hold the database's
    single writer lock only for the write, not for their whole run. PostgreSQL: the
    transaction goes on; the caller takes the row locks it needs (``SELECT ... FOR UPDATE``
    reads the latest committed row).
    """
    if is_postgres(session.get_bind()):
        return True
    if not session.in_transaction():
        with write_intent():
            session.connection()
        return True
    conn = session.connection()
    if conn.info.get(_WRITING):
        return False
    if session.new or session.dirty or session.deleted:
        raise RuntimeError("begin_writing: the read transaction holds unsaved changes")
    conn.connection.dbapi_connection.restart_as_writer()  # a _WriterQueueConnection (make_engine)
    conn.info[_WRITING] = True
    return True


def load_models() -> None:
    """Import every module of this package so all tables are registered on ``Base.metadata``."""
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")


class _WriterQueueConnection(sqlite3.Connection):
    """A SQLite connection whose write transactions queue on an OS file lock.

    SQLite lets one writer in at a time and makes the others poll: a busy connection sleeps
    1, 2, 5, 10 ... 100 ms between tries, and under gunicorn's several processes a third of the
    CPU sat idle in those sleeps while p95 latency grew to a quarter of a second. Waiting on
    ``flock`` instead wakes the next writer the moment the last one commits. Each connection
    has its own open file (``flock`` locks belong to it), so threads of one process queue too.
    Readers never take it (WAL lets them read during a write); a writer that does not say so
    up front still has SQLite's busy timeout.
    """

    lock_path: str | None = None  # set when connected (``_setup_sqlite``)
    _lock_fd: int | None = None
    _holding = False

    def begin_write(self) -> None:
        if self.lock_path is None:
            self.execute("BEGIN IMMEDIATE")
            return
        if self._lock_fd is None:
            self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)  # blocks without the GIL
        self._holding = True
        try:
            self.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._release()
            raise

    def restart_as_writer(self) -> None:
        """End the read transaction under way (it wrote nothing) and begin a writing one."""
        self.execute("COMMIT")
        self.begin_write()

    def _release(self) -> None:
        if self._holding and self._lock_fd is not None:
            self._holding = False
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            self._release()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self._release()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._release()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


def _setup_sqlite(engine: Engine, lock_path: str | None) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" hook below issue BEGIN itself (pysqlite's own implicit
        # transaction handling cannot do BEGIN IMMEDIATE).
        dbapi_conn.isolation_level = None
        dbapi_conn.lock_path = lock_path
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        # WAL lets readers (GET requests, other gunicorn workers) proceed during a write.
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        writing = _write_intent.get()
        conn.info[_WRITING] = writing
        dbapi_conn = conn.connection.dbapi_connection  # a _WriterQueueConnection
        if not writing:
            # on the DBAPI connection, as begin_write does: through exec_driver_sql this one
            # word cost a fortieth of a quiz answer's CPU
            dbapi_conn.execute("BEGIN")
            return
        dbapi_conn.begin_write()


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url`` with the settings kgrade needs on that backend."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        lock_path = None
        connect_args: dict[str, Any] = {"timeout": 30, "factory": _WriterQueueConnection}
        if parsed.database and parsed.database != ":memory:" and "mode=memory" not in url:
            lock_path = f"{parsed.database}.writers"
        engine = create_engine(url, connect_args=connect_args, **kwargs)
        _setup_sqlite(engine, lock_path)
        return engine
    engine = create_engine(url, **kwargs)
    if not kwargs.get("pool_pre_ping"):
        _ping_when_idle(engine)
    return engine


#: Seconds a pooled PostgreSQL connection may sit unused before it is tested on checkout.
PING_AFTER_IDLE_S = 5.0
_CHECKED_IN = "kgrade_checked_in"


def _ping_when_idle(engine: Engine) -> None:
    """Test a pooled connection before handing it out only when it sat unused for a while.

    ``pool_pre_ping`` pings on every checkout: a round trip on every request (a twentieth of a
    quiz answer's CPU). A connection in steady use needs none; one that sat idle may have been
    closed by a restart, a failover or an idle timeout, and is tested and replaced here. A
    connection in use when the server goes away fails its request with a 503 (service.api.outage)
    and SQLAlchemy then replaces every connection of the pool made before the failure.
    """

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info[_CHECKED_IN] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get(_CHECKED_IN)
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as exc:
            raise DisconnectionError(f"pooled connection failed its ping: {exc}") from exc
        if not alive:
            raise DisconnectionError("pooled connection failed its ping")


def is_postgres(engine_or_conn: Any) -> bool:
    return engine_or_conn.dialect.name == "postgresql"


def advisory_lock(session: Any, key: str) -> None:
    """Serialize writers of ``key`` until the transaction ends (a check-then-insert, such as an
    attempt limit, then holds under races). SQLite needs nothing: its writes already run under
    BEGIN IMMEDIATE (``write_intent``)."""
    if is_postgres(session.get_bind()):
        import hashlib

        digest = hashlib.sha256(key.encode()).digest()
        k = int.from_bytes(digest[:8], "big", signed=True)
        _ADVISORY_LOCK.execute(session.connection(), {"k": k})


_ADVISORY_LOCK = Prepared(select(func.pg_advisory_xact_lock(bindparam("k", type_=BigInteger))))


__all__ = [
    "Base",
    "UTCDateTime",
    "advisory_lock",
    "begin_writing",
    "load_models",
    "make_engine",
    "utcnow",
    "write_intent",
]
