"""One grading job in a fresh process: ``python -m workers.job --events-fd N``.

The Celery task starts this by exec (never fork: the Celery process holds broker sockets and
must never initialise CUDA), in its own session so the whole tree can be killed on a timeout.

Protocol: the request arrives as one JSON object on stdin (so neither the source nor a secret
shows in ``/proc/*/cmdline`` or the environment)::

    {"exercise_id": str, "source": str, "device": "cpu"|"cuda", "secret": str|null,
     "reference": bool}

``reference``: the source is the exercise's own reference (an instructor's harness check). It
runs trusted (it may import ``kernels``) and is still timed against the baseline (paired or
cached, as a student's would be), so its speedup shows the harness's run-to-run noise.

Events go to the inherited pipe ``--events-fd`` as JSON lines, never to stdout (logs only)::

    {"event": "progress", "phase": str, "done": int, "total": int|null}
    {"event": "result", "result": {...results.json...}}

Progress phases: ``grading`` (0/null, sent before the core loads), then the core's own
``import``, ``tests``, ``benchmark``, for a passing timed submission its confirmation run's
``confirm-import``, ``confirm-tests``, ``confirm-benchmark``, and ``done`` (see
``workers.harness.parent.grade_ranked``): fixed names and counts only. The task coalesces them
before writing to the database.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import signal
import sys
from typing import IO, Any


class _Events:
    def __init__(self, fd: int) -> None:
        self._out: IO[str] = os.fdopen(fd, "w", buffering=1, encoding="utf-8")

    def send(self, event: dict[str, Any]) -> None:
        self._out.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._out.flush()

    def progress(self, phase: str, done: int, total: int | None = None) -> None:
        self.send({"event": "progress", "phase": phase, "done": done, "total": total})


def result_to_dict(result: Any) -> dict[str, Any]:
    """The results.json form of a ``GradeResult`` (whatever its exact class offers)."""
    if isinstance(result, dict):
        return result
    for name in ("to_results_json", "results_json", "to_json_dict", "to_dict", "as_dict"):
        method = getattr(result, name, None)
        if callable(method):
            value = method()
            if isinstance(value, str):
                value = json.loads(value)
            if isinstance(value, dict):
                return value
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return json.loads(json.dumps(dataclasses.asdict(result), default=str))
    raise TypeError(f"cannot turn {type(result).__name__} into results.json")


def run(request: dict[str, Any], events: _Events) -> dict[str, Any]:
    # Imported here: the grader core (and torch) load only in this process, never in Celery's.
    from workers import harness

    kwargs: dict[str, Any] = {"device": request.get("device", "cpu")}
    if request.get("secret") is not None:
        kwargs["secret"] = bytes.fromhex(request["secret"])
    if request.get("reference"):
        kwargs["trusted"] = True
        kwargs["reference_timing"] = True
    # Every progress event of the core becomes one line on the pipe (the core ignores a failing
    # write, e.g. when the task is gone, so it cannot change the verdict).
    kwargs["progress"] = events.progress
    events.progress("grading", 0, None)
    # A score that would be ranked is confirmed by a second run (KGRADE_CONFIRM_RANKED=0: off).
    ranked = os.environ.get("KGRADE_CONFIRM_RANKED", "1") != "0"
    fn = harness.grade_ranked if ranked else harness.grade
    result = fn(request["exercise_id"], request["source"], **kwargs)
    return result_to_dict(result)


def _die_with_parent() -> None:
    """Take the whole job down when the Celery pool process dies (kill -9, hard time limit).

    The task kills the job's process group on every normal exit and timeout, but a killed pool
    process runs no clean-up: without this the job would grade on (on the GPU) beside the
    redelivered copy. PR_SET_PDEATHSIG sends us SIGTERM, whose handler kills our process group.
    """
    parent = os.getppid()
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass  # not Linux: the task's own group kill still covers timeouts
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os.killpg(0, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.job")
    parser.add_argument("--events-fd", type=int, required=True)
    args = parser.parse_args(argv)
    if os.getpgrp() == os.getpid():  # only as the leader of our own group (as the task starts us)
        _die_with_parent()
    events = _Events(args.events_fd)
    request = json.loads(sys.stdin.read())
    result = run(request, events)
    events.send({"event": "result", "result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
