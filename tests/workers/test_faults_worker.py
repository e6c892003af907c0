"""A Celery worker killed or stopped in the middle of a grading (real worker processes, Redis
and PostgreSQL; the stand-in grader of ``fault_stub`` so a grading lasts as long as needed).

* SIGKILL of the whole worker (an OOM kill, a lost node): the message stays unacked in Redis
  for the whole visibility timeout, so late acks alone would leave the row ``running`` for
  hours. The beat reaper sees the heartbeat stop and requeues it under a new message id; it is
  graded exactly once, and the old message, should it come back, grades nothing.
* SIGTERM: Celery's warm shutdown lets the running grading finish before the worker exits.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workers.faults_support import (
    Worker,
    add_job,
    pg_store,
    row,
    send,
    sender,
    stub_lines,
    wait_for,
    worker_env,
)
from workers import reaper
from workers import store as st

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture()
def store(postgres_url: str) -> Iterator[st.SubmissionStore]:
    with pg_store(postgres_url) as s:
        yield s


def _results(store: st.SubmissionStore, sid: int) -> list[int]:
    return [r["attempt"] for r in store.results(sid)]


def test_sigkilled_worker_job_is_requeued_and_graded_exactly_once(
    store: st.SubmissionStore, redis_url: str, tmp_path: Path
) -> None:
    env = worker_env(
        tmp_path,
        redis_url,
        str(store.engine.url.render_as_string(hide_password=False)),
        # The first grading hangs on (the worker dies under it); any later one is quick.
        KGRADE_STUB_FIRST_SLEEP_S="120",
        KGRADE_STUB_MARK=str(tmp_path / "first-seen"),
    )
    stub_log = tmp_path / "stub.log"
    sid, first_id = add_job(store, "stub-kill")
    app = sender(redis_url, env)
    first = Worker(env, tmp_path)
    try:
        send(app, sid, first_id)
        wait_for("the grading", lambda: stub_lines(stub_log, "start", "stub-kill"), 30, first.log)
        assert row(store, sid).status == st.RUNNING
        # The whole worker dies at once, without any clean-up (its job goes with its pool
        # process, by PR_SET_PDEATHSIG).
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(timeout=10)
    finally:
        first.stop()

    second = Worker(env, tmp_path, beat=True)
    try:
        done = wait_for(
            "the requeued grading",
            lambda: (r := row(store, sid)).status == st.DONE and r,
            60,
            second.log,
        )
        assert done.verdict == "PASS"
        assert done.stuck_requeues == 1 and done.task_id != first_id
        assert done.attempts == 2  # the lost one and the one that graded
        assert _results(store, sid) == [2]
        assert stub_lines(stub_log, "start", "stub-kill") == 2
        assert stub_lines(stub_log, "done", "stub-kill") == 1
        assert "was stuck running" in second.log.read_text()
        assert reaper.stuck_requeues_total(store.engine) == 1

        # The first message comes back (Redis restores it after the visibility timeout):
        # nothing is graded again.
        assert send(app, sid, first_id).get(timeout=30)["status"] == st.DONE
        again = row(store, sid)
        assert (again.attempts, again.verdict, _results(store, sid)) == (2, "PASS", [2])
        assert stub_lines(stub_log, "start", "stub-kill") == 2
    finally:
        second.stop()


def test_sigterm_lets_the_running_grading_finish(
    store: st.SubmissionStore, redis_url: str, tmp_path: Path
) -> None:
    env = worker_env(tmp_path, redis_url, store.engine.url.render_as_string(hide_password=False))
    stub_log = tmp_path / "stub.log"
    sid, task_id = add_job(store, "stub-term-sleep3")
    app = sender(redis_url, env)
    worker = Worker(env, tmp_path)
    try:
        send(app, sid, task_id)
        wait_for(
            "the grading",
            lambda: stub_lines(stub_log, "start", "stub-term-sleep3"),
            30,
            worker.log,
        )
        os.kill(worker.proc.pid, signal.SIGTERM)  # as docker stop / a pod's termination
        assert worker.proc.wait(timeout=60) == 0
    finally:
        worker.stop()
    done = row(store, sid)
    assert (done.status, done.verdict, done.attempts) == (st.DONE, "PASS", 1)
    assert _results(store, sid) == [1]
    assert stub_lines(stub_log, "done", "stub-term-sleep3") == 1
