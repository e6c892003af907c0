"""The database out of reach (PostgreSQL restarting, SQLite locked too long): a 503 with
``Retry-After``, never a 500.

A request that meets the outage has changed nothing: every write runs in one transaction
(``service.api.common.endpoint``) that either commits whole or not at all, so the client may
simply retry, with the same ``Idempotency-Key`` for a write (a commit whose answer was lost in
the outage is then replayed, not repeated). The connection pool recovers on its own: a
disconnect invalidates the pool's connections, and a connection that sat unused for a few
seconds is tested before it is handed out (``service.db._ping_when_idle``), so after a restart
at most the request that meets a dead connection first gets the 503; the next get fresh ones.
"""

from __future__ import annotations

import logging

from flask import Flask, Response, jsonify, request
from sqlalchemy import exc as sa_exc

log = logging.getLogger("kgrade.api")

#: Seconds a client should wait before retrying; a PostgreSQL restart takes a few.
RETRY_AFTER_S = 5

MESSAGE = "the database is unreachable for now (restarting?); nothing was changed, retry shortly"


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` says the database could not be reached, rather than a bug in a query.

    Connection refused, a server that went away mid-query (``OperationalError``), a connection
    already closed under the driver (``InterfaceError``), no pooled connection in time
    (``sqlalchemy.exc.TimeoutError``), or any error SQLAlchemy recognised as a disconnect.
    SQLite's "database is locked" is an ``OperationalError`` too: also a retry-later.
    """
    if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
        return True
    return isinstance(
        error, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError
    ) and not _is_schema_problem(error)


def _is_schema_problem(error: BaseException) -> bool:
    # A missing table or column is a deployment mistake (migrations not run), not an outage a
    # retry would fix: let it be the 500 it is, so that it gets noticed.
    text = str(getattr(error, "orig", error)).lower()
    return "no such table" in text or "no such column" in text or "does not exist" in text


def outage_response(error: BaseException) -> Response:
    """The API's JSON error (``service.api.errors.ErrorSchema``) with ``Retry-After``."""
    log.warning(
        "database unavailable during %s %s: %s",
        request.method,
        request.path,
        str(error).splitlines()[0] if str(error) else type(error).__name__,
    )
    resp = jsonify(code=503, status="Service Unavailable", message=MESSAGE)
    resp.status_code = 503
    resp.headers["Retry-After"] = str(RETRY_AFTER_S)
    return resp


def register_outage_handler(app: Flask) -> None:
    """Answer a database outage with a 503 everywhere in the app (API, pages, LTI)."""

    def handle(error: Exception) -> Response:
        if not is_outage(error):
            raise error
        return outage_response(error)

    for cls in (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError):
        app.register_error_handler(cls, handle)
    # A disconnect may surface as another DBAPIError subclass (e.g. an InternalError raised
    # while the server shuts down); SQLAlchemy then marks it ``connection_invalidated``.
    app.register_error_handler(sa_exc.DBAPIError, handle)
