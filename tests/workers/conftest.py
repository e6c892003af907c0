"""Shared helpers for the grader tests."""

from __future__ import annotations

import os
import subprocess

import pytest

from workers.sandbox import detect_isolation, sandbox_uid


@pytest.fixture(scope="session")
def isolation() -> str:
    return detect_isolation()


def leftover_sandbox_procs() -> list[str]:
    """Processes still running as the sandbox uid (should be none after a job)."""
    uid = sandbox_uid()
    if uid is None:
        return []
    out = subprocess.run(
        ["ps", "-u", str(uid), "-o", "pid=,args="], capture_output=True, text=True
    ).stdout
    return [line for line in out.splitlines() if line.strip() and str(os.getpid()) not in line]


def no_leftovers(timeout: float = 15.0) -> list[str]:
    """Wait for the namespace teardown (hundreds of processes take a moment), then report."""
    import time

    deadline = time.monotonic() + timeout
    left = leftover_sandbox_procs()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = leftover_sandbox_procs()
    return left
