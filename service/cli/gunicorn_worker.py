"""gunicorn's threaded worker, answering the requests gunicorn itself refuses with the API's
JSON error instead of an HTML page.

gunicorn refuses some requests before the app sees them: a request line or a header over its
limits (414, 431), a malformed request line or header (400), an unsupported transfer coding
(501). It writes those answers with ``gunicorn.util.write_error``, an HTML page. Clients of
kgrade's API parse every error as ``{code, status, message, errors}``; this worker installs a
JSON ``write_error`` in its own process (and only there), keeping gunicorn's choice of status.
"""

from __future__ import annotations

import json
import socket

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

#: Sentences for the statuses gunicorn produces, in the API's words; others keep gunicorn's.
MESSAGES: dict[int, str] = {
    400: "malformed HTTP request",
    414: "the URL is too long (at most 8190 bytes in the request line)",
    431: "a request header is too long (at most 32768 bytes per header line) or there are "
    "too many headers",
}


def json_error_bytes(status: int, reason: str, detail: str) -> bytes:
    """A complete HTTP/1.1 response carrying the API's JSON error."""
    message = MESSAGES.get(status, reason.lower())
    if detail and status != 500:
        # gunicorn's detail may quote the offending request line: keep the answer short.
        message = f"{message}: {detail[:200]}"
    body = json.dumps(
        {"code": status, "status": reason, "message": message}, ensure_ascii=True
    ).encode("ascii")
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1")
    return head + body


def write_json_error(sock: socket.socket, status_int: int, reason: str, mesg: str) -> None:
    """Drop-in for ``gunicorn.util.write_error`` (same arguments)."""
    util.write_nonblock(sock, json_error_bytes(status_int, reason, mesg))


class JsonErrorWorker(ThreadWorker):
    def init_process(self) -> None:
        # gunicorn's error path calls util.write_error by module attribute; replacing it here,
        # in the worker process, changes only this server's error pages.
        util.write_error = write_json_error
        super().init_process()
