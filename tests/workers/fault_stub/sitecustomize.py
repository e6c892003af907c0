"""A stand-in grader core for the fault tests (tests/workers/test_faults*.py), loaded through
``PYTHONPATH`` by every Python process the test starts, active only in grader job processes
(``python -m workers.job``). Everything around it is real: the Celery worker, the job process
and its pipe, Redis, the database. It makes a grading last as long as a test needs and lets it
crash on purpose; a real grading of a CPU exercise takes too long for a fault test's budget.

Environment (all optional):

* ``KGRADE_STUB_LOG``: a file that gets ``start <exercise> <pid>`` and ``done <exercise> <pid>``
  lines, so a test counts gradings begun and finished;
* ``KGRADE_STUB_SLEEP_S``: seconds a grading takes (default 0.2);
* ``KGRADE_STUB_FIRST_SLEEP_S`` with ``KGRADE_STUB_MARK``: the first grading (no mark file yet)
  takes this long instead, and leaves the mark;
* ``KGRADE_STUB_CRASH``: ``always``, or ``once`` (with ``KGRADE_STUB_MARK``): the process dies
  with SIGSEGV in the middle of the grading, as a crashing harness would.

The exercise id is the submission's, so ``start``/``done`` lines say which job it was; an id
ending in ``-sleepN`` makes that submission's grading take N seconds.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import types
from pathlib import Path
from typing import Any


def _is_job() -> bool:
    try:
        return b"workers.job" in Path("/proc/self/cmdline").read_bytes()
    except OSError:
        return False


def _log(line: str) -> None:
    path = os.environ.get("KGRADE_STUB_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _first_time() -> bool:
    mark = os.environ.get("KGRADE_STUB_MARK")
    if not mark or os.path.exists(mark):
        return False
    Path(mark).write_text("seen")
    return True


def grade(exercise_id: str, source: str, **kwargs: Any) -> dict[str, Any]:
    _log(f"start {exercise_id} {os.getpid()}")
    crash = os.environ.get("KGRADE_STUB_CRASH", "")
    first = _first_time()
    if crash == "always" or (crash == "once" and first):
        os.kill(os.getpid(), signal.SIGSEGV)
    sleep = float(os.environ.get("KGRADE_STUB_SLEEP_S") or 0.2)
    if m := re.search(r"-sleep([0-9.]+)$", exercise_id):
        sleep = float(m.group(1))
    if first and os.environ.get("KGRADE_STUB_FIRST_SLEEP_S"):
        sleep = float(os.environ["KGRADE_STUB_FIRST_SLEEP_S"])
    progress = kwargs.get("progress")
    end = time.monotonic() + sleep
    while time.monotonic() < end:
        if progress is not None:
            progress("tests", 0, 1)
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))
    _log(f"done {exercise_id} {os.getpid()}")
    return {
        "score": 1.0,
        "gradable": True,
        "verdict": "PASS",
        "output": "stub grader",
        "tests": [],
        "leaderboard": [],
    }


if _is_job():
    stub = types.ModuleType("workers.harness")
    stub.grade = grade  # type: ignore[attr-defined]
    stub.grade_ranked = grade  # type: ignore[attr-defined]
    sys.modules["workers.harness"] = stub
