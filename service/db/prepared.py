"""Statements every quiz request runs, compiled once per dialect and run on the DBAPI cursor.

``Connection.execute`` costs 20 us (SQLite) to 40 us (PostgreSQL) of Python per statement on
top of the driver: a cache-key lookup, an execution context, parameter and result metadata
objects. A quiz answer runs four statements, so that was a fifth of its CPU. A ``Prepared``
statement keeps what those steps compute for its fixed shape (SQL text, the order of its
parameters, the types' bind and result processors) and runs it on the connection's own DBAPI
cursor, inside the transaction the connection already has.

What stays SQLAlchemy's: a driver error goes through ``Connection._handle_dbapi_exception``, so
it is raised as the same ``sqlalchemy.exc.DBAPIError`` subclass, a disconnect invalidates the
connection and the pool, and ``handle_error`` events run (``service.api.outage`` then answers
503). What does not run: ``before/after_cursor_execute`` events and ``echo`` logging; use it
only for statements of a fixed shape (no expanding ``IN``, no defaults filled in at execution:
a column left out of an insert raises when the statement is prepared, not a silent NULL).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

_Processor = Callable[[Any], Any] | None
#: Key of the kept cursor in a pooled connection's ``info``: (the DBAPI connection, its cursor).
_CURSOR = "kgrade_prepared_cursor"


class PreparedRow(tuple):  # type: ignore[type-arg]
    """A result row: a tuple whose columns are also attributes (as SQLAlchemy's ``Row``)."""

    __slots__ = ()
    _keys: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._keys[name]]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class _Plan:
    sql: str
    #: the bind names in the order of the SQL's placeholders; None: the driver takes a dict
    order: tuple[str, ...] | None
    bind_procs: dict[str, Callable[[Any], Any]]
    #: values of the statement's own literals (``times_answered + 1``'s 1)
    fixed: dict[str, Any]
    required: frozenset[str]
    result_types: tuple[Any, ...]
    row_class: type[PreparedRow] | None
    #: the result processors, made from the first cursor.description (driver type codes)
    result_procs: tuple[_Processor, ...] | None = None


class PreparedResult:
    __slots__ = ("rows", "rowcount")

    def __init__(self, rows: list[PreparedRow], rowcount: int) -> None:
        self.rows = rows
        self.rowcount = rowcount

    def first(self) -> PreparedRow | None:
        return self.rows[0] if self.rows else None

    def scalar(self) -> Any:
        return self.rows[0][0] if self.rows else None


class Prepared:
    """``stmt`` ready to run on any connection: ``Prepared(stmt).execute(conn, params)``.

    ``column_keys``: for an INSERT or UPDATE without ``values()``, the columns the parameters
    give (as ``Connection.execute`` infers them from its first parameter set).
    """

    def __init__(self, stmt: ClauseElement, column_keys: Iterable[str] | None = None) -> None:
        self.stmt = stmt
        self.column_keys = list(column_keys) if column_keys is not None else None
        self._plans: dict[tuple[type, str], _Plan] = {}

    def _plan(self, dialect: Dialect) -> _Plan:
        # per dialect class and paramstyle, not per engine: tests build many of the same kind
        key = (type(dialect), dialect.paramstyle)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._compile(dialect)
        return plan

    def _compile(self, dialect: Dialect) -> _Plan:
        compiled = self.stmt.compile(dialect=dialect, column_keys=self.column_keys)
        assert isinstance(compiled, SQLCompiler)
        if compiled.escaped_bind_names or compiled.literal_execute_params:
            raise ValueError(f"Prepared: bind names need escaping or expanding: {compiled}")
        fixed, required = {}, set()
        for bind, name in compiled.bind_names.items():
            if bind.callable is not None or bind.value is not None or not bind.required:
                fixed[name] = bind.effective_value
            else:
                required.add(name)
        if compiled.insert_prefetch or compiled.update_prefetch:
            # column defaults Connection.execute would compute per execution
            raise ValueError(f"Prepared: give every column a value: {compiled}")
        keys = [c.keyname for c in compiled._result_columns]
        row_class = None
        if keys:
            row_class = type("Row", (PreparedRow,), {"__slots__": (), "_keys": {}})
            row_class._keys = {k: i for i, k in enumerate(keys)}
        return _Plan(
            sql=compiled.string,
            order=tuple(compiled.positiontup or ()) if compiled.positional else None,
            bind_procs=dict(compiled._bind_processors),
            fixed=fixed,
            required=frozenset(required),
            result_types=tuple(c.type for c in compiled._result_columns),
            row_class=row_class,
        )

    def execute(self, conn: Connection, params: Mapping[str, Any] | None = None) -> PreparedResult:
        """Run on ``conn`` (in its transaction, begun if none is); rows are fetched whole."""
        dialect = conn.dialect
        plan = self._plan(dialect)
        values = {**plan.fixed, **params} if params else dict(plan.fixed)
        missing = plan.required.difference(values)
        if missing:
            raise ValueError(f"Prepared: no value for {sorted(missing)} in {plan.sql!r}")
        for name, proc in plan.bind_procs.items():
            values[name] = proc(values[name])
        args: Any = values if plan.order is None else tuple(values[n] for n in plan.order)
        if not conn.in_transaction():
            conn.begin()
        pooled = conn.connection
        dbapi_conn = pooled.dbapi_connection
        assert dbapi_conn is not None
        # one cursor per DBAPI connection, kept in the pool's record of it (which forgets it
        # when the connection is invalidated): a new psycopg cursor cost 6 us of CPU more
        # per statement than running the next statement on the last one
        kept = pooled.info.get(_CURSOR)
        if kept is not None and kept[0] is dbapi_conn:
            cursor = kept[1]
        else:
            cursor = dbapi_conn.cursor()
            pooled.info[_CURSOR] = (dbapi_conn, cursor)
        try:
            cursor.execute(plan.sql, args)
            # not cursor.description to tell: psycopg builds it anew on every read (a
            # twentieth of an answer's CPU); it is read once, for the result processors
            raw = cursor.fetchall() if plan.row_class is not None else []
            rowcount = cursor.rowcount
            if raw and plan.result_procs is None:
                plan.result_procs = tuple(
                    t._cached_result_processor(dialect, d[1])
                    for t, d in zip(plan.result_types, cursor.description, strict=True)
                )
        except BaseException as exc:
            pooled.info.pop(_CURSOR, None)  # the handler closes it
            conn._handle_dbapi_exception(exc, plan.sql, args, cursor, None)
        rows: list[PreparedRow] = []
        if raw:
            procs = plan.result_procs
            assert procs is not None and plan.row_class is not None
            make = plan.row_class
            rows = [
                make([v if p is None or v is None else p(v) for p, v in zip(procs, r, strict=True)])
                for r in raw
            ]
        return PreparedResult(rows, rowcount)
