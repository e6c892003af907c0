"""Request ids and structured logs for the API (the stdlib parts are ``workers.logs``).

Every request gets an id: the caller's ``X-Request-ID`` when it is sane (a proxy's or a load
balancer's, so one id spans their logs and ours), else a new one. It is on the response as
``X-Request-ID``, on every log line written while the request is handled, and passed to the
grading task of a submission (``service.core.submissions``), whose log lines carry it too.

``KGRADE_LOG_FORMAT=json`` writes one JSON object per log line, and one ``request`` line per
request (method, endpoint, path, status, duration), since gunicorn's own access log is not
JSON. The default (``plain``) leaves the log format as it was.
"""

from __future__ import annotations

import logging
import os
import time

from flask import Flask, Response, current_app, g, request

from workers.logs import REQUEST_ID, configure_logging, log_format, sane_request_id

HEADER = "X-Request-ID"

access_log = logging.getLogger("kgrade.access")


def current_request_id() -> str | None:
    """The id of the request being handled, or None outside of one."""
    rid = REQUEST_ID.get()
    return None if rid == "-" else rid


def register_logs(app: Flask) -> None:
    configure_logging()
    app.config.setdefault("LOG_REQUESTS", log_format() == "json")
    # First in line, so that even a request another hook answers early has its id.
    app.before_request_funcs.setdefault(None, []).insert(0, _assign_id)
    app.after_request(_finish)
    app.teardown_request(_forget)


#: uuid4's fixed bits: version 4 (bits 76-79) and the RFC 4122 variant (bits 62-63).
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def new_request_id() -> str:
    """``uuid.uuid4().hex``, the same 32 hex digits from the same 16 random bytes, without
    building a ``UUID`` object (its checks were a third of the request id hook's CPU)."""
    n = int.from_bytes(os.urandom(16), "big") & _UUID4_CLEAR | _UUID4_SET
    return f"{n:032x}"


def _assign_id() -> None:
    rid = sane_request_id(request.headers.get(HEADER)) or new_request_id()
    g.kgrade_request_id = rid
    g.kgrade_request_id_token = REQUEST_ID.set(rid)
    g.kgrade_log_started = time.perf_counter()


def _finish(response: Response) -> Response:
    rid = g.get("kgrade_request_id")
    if rid is None:
        return response
    response.headers[HEADER] = rid
    if current_app.config.get("LOG_REQUESTS"):
        rule = request.url_rule.rule if request.url_rule is not None else None
        access_log.info(
            "%s %s %s",
            request.method,
            request.path,
            response.status_code,
            extra={
                "method": request.method,
                "path": request.path,
                "endpoint": rule,
                "status": response.status_code,
                "duration_ms": round((time.perf_counter() - g.kgrade_log_started) * 1000, 2),
            },
        )
    return response


def _forget(_: BaseException | None = None) -> None:
    token = g.pop("kgrade_request_id_token", None)
    if token is not None:
        try:
            REQUEST_ID.reset(token)
        except ValueError:  # torn down in another context (a test client keeping it)
            REQUEST_ID.set("-")
