"""The runner's end of its channel to the parent: one JSON object per line on a socket the parent
created and passed as an explicit fd (stdout/stderr are logs only), and how an exception the
submission raised is reported on it. The parent validates every message against what it asked
for (``workers.harness.channel``): nothing here is trusted once the submission is imported.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import traceback
from typing import Any

# bound before any student code exists (a replaced builtin cannot reach them)
_type = type
_isinstance = isinstance

MAX_LINE = 1 << 20
# resource exhaustion, not a bug in the submission: RESOURCE_LIMIT rather than RUNTIME_ERROR
_RESOURCE_ERRNOS = (
    errno.EAGAIN,
    errno.ENOMEM,
    errno.EMFILE,
    errno.ENFILE,
    errno.EFBIG,
    errno.ENOSPC,
)


class ChannelPart:
    """``Rank``'s messages: ``send`` one reply, ``recv`` the parent's next request."""

    sock: socket.socket
    rfile: Any  # the socket's buffered reader

    def send(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj) + "\n").encode()
        self.sock.sendall(data)

    def recv(self) -> dict[str, Any]:
        line = self.rfile.readline(MAX_LINE)
        if not line:  # the parent closed the channel: nothing more to do
            sys.exit(0)
        return json.loads(line)


def error_report(e: BaseException) -> dict[str, Any]:
    """An exception as the parent reads it: type, message, capped traceback, and its kind
    (``resource``: out of memory, processes, files or disk; else ``error``)."""
    kind = "error"
    name = _type(e).__name__
    if (
        name in ("MemoryError", "OutOfMemoryError")
        or "out of memory" in str(e).lower()
        or _isinstance(e, OSError)
        and e.errno in _RESOURCE_ERRNOS
    ):
        kind = "resource"
    tb = "".join(traceback.format_exception(e))[-3000:]
    return {"type": name, "msg": str(e)[:1000], "tb": tb, "kind": kind}


def quick_exit(*streams: Any) -> None:
    """Leave without the interpreter's teardown of torch (0.3-0.6 s of every job's close on the
    development CPU, more with a CUDA context): once a process has said its last word, its
    ``streams`` are flushed and the kernel and the driver reclaim the rest."""
    for stream in streams:
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)
