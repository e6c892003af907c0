"""Gradings that fail for infrastructure reasons end in a clear state, never stuck in
``running``: a harness that crashes (requeued once: it passes if the crash was passing), a full
disk under the job folders (the core's INFRA_ERROR, requeued once, then final), a worker that
cannot even start the job. The task runs in this process (eager) on PostgreSQL; the job is a
real ``python -m workers.job`` process, with the stand-in grader of ``fault_stub`` where the
grader must crash."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workers.faults_support import STUB, add_job, pg_store, row, stub_lines
from workers import store as st
from workers import tasks


@pytest.fixture()
def store(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[st.SubmissionStore]:
    with pg_store(postgres_url) as s:
        monkeypatch.setenv("DATABASE_URL", s.engine.url.render_as_string(hide_password=False))
        monkeypatch.setenv("KGRADE_VAR_DIR", str(tmp_path / "var"))
        monkeypatch.setenv("KGRADE_STUB_LOG", str(tmp_path / "stub.log"))
        yield s


def _grade(store: st.SubmissionStore, name: str) -> Any:
    sid, task_id = add_job(store, name)
    tasks.grade_submission.apply(args=[sid], task_id=task_id)
    return row(store, sid)


def _stub(monkeypatch: pytest.MonkeyPatch, crash: str, tmp_path: Path) -> None:
    monkeypatch.setenv("PYTHONPATH", str(STUB))
    monkeypatch.setenv("KGRADE_STUB_CRASH", crash)
    monkeypatch.setenv("KGRADE_STUB_MARK", str(tmp_path / "crashed-once"))


def test_a_harness_crash_is_requeued_and_the_retry_grades(
    store: st.SubmissionStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _stub(monkeypatch, "once", tmp_path)
    done = _grade(store, "stub-crash-once")
    assert (done.status, done.verdict, done.attempts) == (st.DONE, "PASS", 2)
    assert [r["attempt"] for r in store.results(done.id)] == [2]
    log = tmp_path / "stub.log"
    assert stub_lines(log, "start", "stub-crash-once") == 2
    assert stub_lines(log, "done", "stub-crash-once") == 1


def test_a_harness_that_always_crashes_ends_infra_error(
    store: st.SubmissionStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _stub(monkeypatch, "always", tmp_path)
    done = _grade(store, "stub-crash-always")
    assert (done.status, done.verdict, done.gradable) == (st.DONE, "INFRA_ERROR", False)
    assert done.attempts == tasks.MAX_RUNS
    assert stub_lines(tmp_path / "stub.log", "start", "stub-crash-always") == tasks.MAX_RUNS


@pytest.fixture()
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 128 KiB tmpfs, filled up: the disk that holds the job folders, full."""
    mnt = tmp_path / "jobs"
    mnt.mkdir()
    got = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if got.returncode != 0:
        reason = f"cannot mount a tmpfs here ({got.stderr.strip()}); make test runs as root"
        if os.environ.get("KGRADE_REQUIRE_SERVICES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        fd = os.open(mnt / "fill", os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_job_disk_ends_infra_error_after_one_requeue(
    store: st.SubmissionStore, monkeypatch: pytest.MonkeyPatch, full_disk: Path
) -> None:
    # The real grader core: it cannot lay out the job folder and says INFRA_ERROR itself.
    monkeypatch.setenv("KGRADE_JOB_ROOT", str(full_disk))
    sid, task_id = add_job(store, "attention-merge")
    tasks.grade_submission.apply(args=[sid], task_id=task_id)
    done = row(store, sid)
    assert (done.status, done.verdict, done.gradable) == (st.DONE, "INFRA_ERROR", False)
    assert done.attempts == tasks.MAX_RUNS  # requeued once: another worker may have room
    (final,) = [r["result"] for r in store.results(sid)]
    assert "No space left on device" in final["output"]


def test_a_worker_that_cannot_start_the_job_ends_infra_error(
    store: st.SubmissionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's own disk is full: it cannot even open the job's log file.
    def no_space(*_a: Any, **_k: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tasks.tempfile, "TemporaryFile", no_space)
    done = _grade(store, "stub-no-space")
    assert (done.status, done.verdict, done.attempts) == (st.DONE, "INFRA_ERROR", tasks.MAX_RUNS)
