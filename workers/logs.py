"""Logging shared by the API and the workers (stdlib only: workers never import the service).

A request id follows a submission from the API to the worker: the API puts it in
``REQUEST_ID`` for each request (``service.logs``) and passes it to the grading task, which
puts it there for the grading. ``RequestIdFilter`` copies it onto every log record, and with
``KGRADE_LOG_FORMAT=json`` ``JsonFormatter`` writes each record as one JSON object per line
(default ``plain``: the log format is left as it is, as ``make run`` prints it).
"""

from __future__ import annotations

import json
import logging
import os
import re
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

#: The request (or grading) being handled in this thread; "-" outside of one.
REQUEST_ID: ContextVar[str] = ContextVar("kgrade_request_id", default="-")

LOG_FORMAT_ENV = "KGRADE_LOG_FORMAT"
LOG_LEVEL_ENV = "KGRADE_LOG_LEVEL"
LOG_FORMATS = ("plain", "json")

#: What an incoming X-Request-ID may be to be kept: short, and nothing that could forge a log
#: line or a header (no spaces, quotes or control characters). Anything else gets a new id.
SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

#: LogRecord attributes every record has; anything else was passed with ``extra=`` and is
#: written as a field of its own.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "request_id",
    "taskName",
}


def sane_request_id(value: str | None) -> str | None:
    """``value`` when it may serve as a request id, else None."""
    return value if value and SANE_REQUEST_ID.fullmatch(value) else None


def log_format() -> str:
    """``plain`` or ``json``, from ``KGRADE_LOG_FORMAT`` (a clear error for anything else)."""
    fmt = (os.environ.get(LOG_FORMAT_ENV) or "plain").strip().lower()
    if fmt not in LOG_FORMATS:
        raise ValueError(f"{LOG_FORMAT_ENV} must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    return fmt


class RequestIdFilter(logging.Filter):
    """Puts the current request id on each record (``%(request_id)s``); never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id, extras, traceback."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or REQUEST_ID.get(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack_info"] = self.formatStack(record.stack_info)
        # default=str: an extra that JSON cannot hold is written as its text, never lost.
        return json.dumps(doc, default=str, ensure_ascii=False)


def use_json(handler: logging.Handler) -> None:
    """Make ``handler`` write JSON lines carrying the request id (idempotent)."""
    handler.setFormatter(JsonFormatter())
    if not any(isinstance(f, RequestIdFilter) for f in handler.filters):
        handler.addFilter(RequestIdFilter())


def configure_logging() -> None:
    """With ``KGRADE_LOG_FORMAT=json``, the root logger writes JSON lines to stderr at
    ``KGRADE_LOG_LEVEL`` (default INFO). Plain leaves logging as the process set it up."""
    if log_format() != "json":
        return
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, "_kgrade_json", False)]
    if not ours:
        handler = logging.StreamHandler()
        handler._kgrade_json = True  # type: ignore[attr-defined]  # found again on a re-run
        root.addHandler(handler)
        ours = [handler]
    for handler in ours:
        use_json(handler)
    root.setLevel((os.environ.get(LOG_LEVEL_ENV) or "INFO").upper())
