"""Run the NSA Triton kernels under TRITON_INTERPRET=1 in a fresh process (spec §5).

The interpreter is chosen when @triton.jit decorates, so it must be set before kernels are
imported: this test launches pytest on test_nsa_interp_cases.py with the variable set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_nsa_triton_kernels_under_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/kernels/test_nsa_interp_cases.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert "skipped" not in proc.stdout.splitlines()[-1], tail
