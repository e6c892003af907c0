"""Shared helpers for the grader tests."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest
from sqlalchemy import insert

from workers import store as st
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


def add_queued_submission(
    store: st.SubmissionStore, source: str, *, exercise_id: str = "demo", attempts: int = 0
) -> int:
    """Insert a queued CPU submission by student ``ada`` straight into the store; its id."""
    with store.engine.begin() as conn:
        return conn.execute(
            insert(st.submissions_table)
            .values(
                exercise_id=exercise_id,
                course_id=1,
                user_id=1,
                student="ada",
                token_id=1,
                source=source,
                source_sha256=hashlib.sha256(source.encode()).hexdigest(),
                device="cpu",
                queue="cpu",
                status=st.QUEUED,
                attempts=attempts,
                created_at=st.utcnow(),
            )
            .returning(st.submissions_table.c.id)
        ).scalar_one()
