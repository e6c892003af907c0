"""Run the Triton kernel cases under the interpreter in a fresh process.

TRITON_INTERPRET must be set before triton is first imported, and this pytest process has
imported it already (plain CPU tests), so the cases run in a child pytest with the variable set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).with_name("triton_interpret_cases.py")


@pytest.mark.slow
def test_triton_kernel_under_interpreter():
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"interpreter cases failed:\n{tail}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], tail
