"""Run the Triton kernel cases under the interpreter in a fresh process (spec §5).

TRITON_INTERPRET must be set before triton is first imported, and this pytest process has
imported it already (plain CPU tests), so each case module runs in a child pytest with the
variable set. The case modules are not named test_* so the parent does not collect them;
test_nsa_backward.py is the exception: the parent runs it on the PyTorch path, the child
on the Triton kernels.

The children are started together when the first of these tests runs, and each test waits
for its own: the interpreter is one Python thread, and one after another they were CI's
longest stretch with a core idle (162 + 99 + 27 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
CASES = ["triton_interpret_cases.py", "nsa_interpret_cases.py", "test_nsa_backward.py"]
TIMEOUT_S = 900  # all three share the cores: the longest (the NSA cases) takes 7 min alone


class Child:
    """One child pytest run with its output in a temporary file (a pipe could fill up)."""

    def __init__(self, cases: str) -> None:
        env = dict(
            os.environ,
            TRITON_INTERPRET="1",
            PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            # the children run side by side: one thread each instead of each taking every core
            OMP_NUM_THREADS="1",
        )
        self.log: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / cases)],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait(self) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.log.seek(0)
        out = self.log.read()
        self.log.close()
        return rc, out


@pytest.fixture(scope="module")
def children(request: pytest.FixtureRequest) -> Iterator[dict[str, Child]]:
    # only the cases this session selected (-k, a node id) are started
    wanted = {
        item.callspec.params["cases"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    started = {cases: Child(cases) for cases in CASES if cases in wanted}
    yield started
    for child in started.values():  # a test that failed before waiting leaves none behind
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("cases", CASES)
def test_triton_kernels_under_interpreter(children: dict[str, Child], cases: str) -> None:
    rc, out = children[cases].wait()
    tail = out[-6000:]
    assert rc == 0, f"interpreter cases failed:\n{tail}"
    last = out.strip().splitlines()[-1]
    assert " passed" in last and "skipped" not in last, tail
