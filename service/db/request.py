"""The database session of one request: a Core connection, and an ORM ``Session`` on the same
connection and transaction only once something uses the ORM.

The quiz flow (start, answer, submit) runs only prepared Core statements on
``session.connection()``; an ORM ``Session`` around them cost about a sixth of a quiz request's
CPU in-process (its transaction bookkeeping on begin, commit and close, on top of the
connection's own). ``RequestSession`` offers the ``Session`` methods that such code uses
(``connection``, ``get_bind``, ``in_transaction``, ``get_transaction``, ``commit``,
``rollback``, ``close``, ``info``, ``new``/``dirty``/``deleted``) on a plain ``Connection``, and
hands every other attribute to a real ``Session`` made on first use, bound to that connection
in ``join_transaction_mode="control_fully"``: from then on the ORM session runs the transaction
(it joins one the Core statements began; its ``commit`` commits it, with its flush and its
``after_commit`` events), so one request is one transaction whichever way it is used.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, RootTransaction
from sqlalchemy.orm import Session, sessionmaker


class RequestSession:
    """A ``Session`` stand-in that makes the ORM session only when the ORM is used."""

    def __init__(self, engine: Engine, factory: sessionmaker[Session]) -> None:
        self._engine = engine
        self._factory = factory
        self._conn: Connection | None = None
        self._orm: Session | None = None
        #: run each statement as its own transaction (``autocommit``): until ``close``
        self._autocommit = False
        #: ``Session.info``'s place: per request, kept across commits and ``close`` as there
        self.info: dict[Any, Any] = {}

    @property
    def orm(self) -> Session:
        """The ORM session of this request, made now if none is yet (``tasks.after_commit``
        listens to its events)."""
        if self._orm is None:
            self._orm = self._factory(bind=self._core(), join_transaction_mode="control_fully")
            self._join()
        return self._orm

    def _join(self) -> None:
        """Have the ORM session take over a transaction begun on the connection without it
        (by Core statements before it was made, or on a connection taken from it before its
        last commit), so that its commit, rollback and events apply to that one."""
        if self._orm is not None and self._conn is not None and self._conn.in_transaction():
            self._orm.connection()

    def _core(self) -> Connection:
        if self._conn is None:
            conn = self._engine.connect()
            if self._autocommit:
                conn.execution_options(isolation_level="AUTOCOMMIT")
            self._conn = conn
        return self._conn

    def autocommit(self) -> bool:
        """From now until ``close``, have every statement commit by itself: no BEGIN and no
        COMMIT round trips (a request whose every write is one self-guarding statement, see
        ``service.core.attempts.answer``). ``commit`` and ``rollback`` then do nothing on the
        database. Only on a session that has no transaction and no ORM session yet; False, and
        nothing changed, otherwise."""
        if self._orm is not None or (self._conn is not None and self._conn.in_transaction()):
            return False
        self._autocommit = True
        if self._conn is not None:
            self._conn.execution_options(isolation_level="AUTOCOMMIT")
        return True

    def connection(self, **kwargs: Any) -> Connection:
        """The request's connection, in a transaction (begun now if none is), as
        ``Session.connection``."""
        if self._orm is not None or kwargs:
            return self.orm.connection(**kwargs)
        conn = self._core()
        if not conn.in_transaction():
            conn.begin()
        return conn

    def get_bind(self, *_args: Any, **_kwargs: Any) -> Engine:
        # the engine, as a Session bound to it answers (never the connection the ORM session
        # is bound to): callers read its dialect
        return self._engine

    def in_transaction(self) -> bool:
        if self._orm is not None and self._orm.in_transaction():
            return True
        return self._conn is not None and self._conn.in_transaction()

    def get_transaction(self) -> RootTransaction | None:
        """The transaction under way, a new object for each (``quizzes_store.note_version``
        compares them), whether the ORM session runs it or not."""
        return self._conn.get_transaction() if self._conn is not None else None

    def commit(self) -> None:
        if self._orm is not None:
            self._join()
            self._orm.commit()
        elif self._conn is not None and self._conn.in_transaction():
            self._conn.commit()

    def rollback(self) -> None:
        if self._orm is not None:
            self._join()
            self._orm.rollback()
        elif self._conn is not None and self._conn.in_transaction():
            self._conn.rollback()

    def close(self) -> None:
        """Roll back what was not committed and give the connection back; usable again after,
        as a ``Session`` is."""
        orm, conn = self._orm, self._conn
        self._orm = self._conn = None
        self._autocommit = False
        try:
            if orm is not None:
                orm.close()
        finally:
            if conn is not None:
                conn.close()

    @property
    def new(self) -> Any:
        return self._orm.new if self._orm is not None else ()

    @property
    def dirty(self) -> Any:
        return self._orm.dirty if self._orm is not None else ()

    @property
    def deleted(self) -> Any:
        return self._orm.deleted if self._orm is not None else ()

    def __getattr__(self, name: str) -> Any:
        # anything else is the ORM's (execute, add, get, flush, begin_nested, ...); never this
        # object's own attributes, read before __init__ set them (copy, pickle)
        if name in _OWN:
            raise AttributeError(name)
        return getattr(self.orm, name)


_OWN = frozenset({"_engine", "_factory", "_conn", "_orm", "_autocommit", "info"})


def orm_session(session: Session | RequestSession) -> Session:
    """The ORM ``Session`` behind ``session`` (for SQLAlchemy APIs that need the real one, such
    as ``event.listen``)."""
    return session.orm if isinstance(session, RequestSession) else session
