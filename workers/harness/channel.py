"""The parent's ends of a job's channels (grader spec §2): the sandboxed runner's socket (JSON
lines, every read with a deadline, every message bounded) and the trusted checker's pipes, and
the schema every runner report of a call must fit. Nothing a runner sends is trusted: a message
that is malformed, oversized or not what was asked for is INTEGRITY_VIOLATION.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from workers.harness.failure import Failure
from workers.verdicts import Verdict

REPO = Path(__file__).resolve().parents[2]
MAX_MSG = 1 << 20


class Channel:
    """JSON lines over a parent-created socket; every read has a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def send(self, obj: dict[str, Any]) -> None:
        try:
            self.sock.sendall((json.dumps(obj) + "\n").encode())
        except OSError as e:
            raise EOFError(str(e)) from e

    def recv(self, deadline: float) -> dict[str, Any]:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 1]
                try:
                    msg = json.loads(line)
                except ValueError as e:
                    raise Failure(Verdict.INTEGRITY_VIOLATION, "malformed runner message") from e
                if not isinstance(msg, dict):
                    raise Failure(Verdict.INTEGRITY_VIOLATION, "malformed runner message")
                return msg
            if len(self.buf) > MAX_MSG:
                raise Failure(Verdict.INTEGRITY_VIOLATION, "oversized runner message")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise
            except OSError as e:
                raise EOFError(str(e)) from e
            if not chunk:
                raise EOFError("runner closed the channel")
            self.buf += chunk


class CheckerProc:
    """The trusted checker: JSON lines over its stdin/stdout pipes."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "workers.harness.checker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=str(REPO),
            start_new_session=True,
            text=True,
        )
        self.pending = 0  # requests sent whose replies are not read yet

    def send(self, cmd: dict[str, Any]) -> None:
        """A request whose reply is read later (``reply``): the checker works meanwhile."""
        assert self.proc.stdin
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except OSError as e:
            raise Failure(Verdict.INFRA_ERROR, f"checker died: {e}") from e
        self.pending += 1

    def reply(self) -> dict[str, Any]:
        """The oldest unread reply."""
        assert self.proc.stdout and self.pending > 0
        try:
            line = self.proc.stdout.readline()
        except OSError as e:
            raise Failure(Verdict.INFRA_ERROR, f"checker died: {e}") from e
        self.pending -= 1
        if not line:
            err = self.proc.stderr.read()[-3000:] if self.proc.stderr else ""
            raise Failure(Verdict.INFRA_ERROR, f"checker died: {err}")
        rep = json.loads(line)
        if not rep.get("ok"):
            raise Failure(
                Verdict.INFRA_ERROR, f"checker error: {rep.get('error')}\n{rep.get('tb', '')}"
            )
        return rep

    def ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        while self.pending:  # a reply nobody waited for (a request made ahead, then a failure)
            self.reply()
        self.send(cmd)
        return self.reply()

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.ask({"op": "exit"})
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - clean-up must not mask the verdict
            self.proc.kill()


def validate_called(
    msg: dict[str, Any], call_id: str, n_out: int | None, kind: str = "called"
) -> None:
    """Schema of a runner's report of one call, ``called`` (a test) or ``done`` (a timed call,
    which always carries its times and output digests): every field typed and bounded, ids
    matching. ``n_out`` None: any number of outputs (a null call describes none)."""

    def need(c: bool, what: str) -> None:
        if not c:
            raise Failure(Verdict.INTEGRITY_VIOLATION, f"runner message: {what}")

    timed = kind == "done"
    need(msg.get("t") == kind and msg.get("id") == call_id, "unexpected message or id")
    need(isinstance(msg.get("ok"), bool), "ok flag")
    need(isinstance(msg.get("wall_ms"), int | float), "wall_ms")
    need(isinstance(msg.get("tamper", []), list), "tamper list")
    need(isinstance(msg.get("ops", {}), dict), "ops map")
    if msg["ok"]:
        outs = msg.get("outputs")
        need(isinstance(outs, list) and n_out in (None, len(outs)), "outputs list")
        need(all(isinstance(o, dict) for o in outs), "output entries")
        need(isinstance(msg.get("inputs"), dict), "inputs map")
        for k in ("ev_stream_ms", "ev_sync_ms", "capture_ms"):
            if timed or k in msg:
                need(isinstance(msg.get(k), int | float) and msg[k] >= 0, k)
        if timed:
            need(isinstance(msg.get("digests"), dict), "digests")
