"""Run the Triton kernel cases under the interpreter in a fresh process (spec §5).

TRITON_INTERPRET must be set before triton is first imported, and this pytest process has
imported it already (plain CPU tests), so each case module runs in a child pytest with the
variable set. The case modules are not named test_* so the parent does not collect them;
test_nsa_backward.py is the exception: the parent runs it on the PyTorch path, the child
on the Triton kernels.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent


@pytest.mark.slow
@pytest.mark.parametrize(
    "cases", ["triton_interpret_cases.py", "nsa_interpret_cases.py", "test_nsa_backward.py"]
)
def test_triton_kernels_under_interpreter(cases: str) -> None:
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / cases)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"interpreter cases failed:\n{tail}"
    last = proc.stdout.strip().splitlines()[-1]
    assert " passed" in last and "skipped" not in last, tail
