"""The stuck-job reaper and the message fence on PostgreSQL (no worker): which rows are stuck,
that each is requeued once under a new message id and counted, and that a replaced message
can start nothing."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from tests.workers.faults_support import add_job, pg_store, row
from workers import celery_app as ca
from workers import reaper
from workers import store as st


@pytest.fixture()
def store(postgres_url: str) -> Iterator[st.SubmissionStore]:
    with pg_store(postgres_url) as s:
        yield s


def _set(store: st.SubmissionStore, sid: int, **values: Any) -> None:
    t = st.submissions_table
    with store.engine.begin() as conn:
        conn.execute(update(t).where(t.c.id == sid).values(**values))


def _ago(seconds: float) -> Any:
    return st.utcnow() - timedelta(seconds=seconds)


def test_a_replaced_message_starts_nothing(store: st.SubmissionStore) -> None:
    sid, old = add_job(store, "demo")
    _set(store, sid, task_id="new-owner")
    assert reaper.claim(store.engine, sid, old) is None
    assert (row(store, sid).status, row(store, sid).attempts) == (st.QUEUED, 0)
    assert reaper.claim(store.engine, sid, "new-owner") == 1
    assert row(store, sid).status == st.RUNNING and row(store, sid).heartbeat_at is not None


def test_reaper_requeues_only_jobs_that_are_gone(store: st.SubmissionStore) -> None:
    ids = {name: add_job(store, name) for name in ("dead", "alive", "waiting", "lost", "final")}
    dead, alive, waiting, lost, final = (ids[n][0] for n in ids)
    _set(store, dead, status=st.RUNNING, attempts=1, heartbeat_at=_ago(600))
    _set(store, alive, status=st.RUNNING, attempts=1, heartbeat_at=_ago(5))
    _set(store, waiting, created_at=_ago(3600))  # an hour in a long queue: still there
    _set(store, lost, created_at=_ago(3600))  # its message is gone from the broker
    _set(store, final, status=st.DONE, heartbeat_at=_ago(3600))
    sent: list[tuple[int, str, str]] = []

    def send(sid: int, queue: str, task_id: str) -> None:
        sent.append((sid, queue, task_id))

    before = dict(reaper.REAPED)
    in_broker = {ids["waiting"][1]}
    got = reaper.reap(store.engine, send, lambda: in_broker, stuck_after_s=180)
    assert sorted((r.submission_id, r.was) for r in got) == sorted(
        [(dead, st.RUNNING), (lost, st.QUEUED)]
    )
    assert sorted(s[0] for s in sent) == sorted([dead, lost])
    for sid, queue, task_id in sent:
        r = row(store, sid)
        assert (r.status, r.task_id, r.stuck_requeues, queue) == (st.QUEUED, task_id, 1, "cpu")
        assert task_id != ids["dead" if sid == dead else "lost"][1]
    assert row(store, alive).status == st.RUNNING and row(store, alive).stuck_requeues == 0
    assert row(store, waiting).task_id == ids["waiting"][1]
    assert reaper.stuck_requeues_total(store.engine) == 2
    assert reaper.REAPED[st.RUNNING] - before.get(st.RUNNING, 0) == 1
    assert reaper.REAPED[st.QUEUED] - before.get(st.QUEUED, 0) == 1
    # The requeued rows are fresh again (and their new messages now in the broker): a second
    # run finds nothing.
    in_broker |= {s[2] for s in sent}
    assert reaper.reap(store.engine, send, lambda: in_broker, stuck_after_s=180) == []


def test_a_failed_send_is_retried_by_the_next_run(store: st.SubmissionStore) -> None:
    sid, _ = add_job(store, "demo")
    _set(store, sid, status=st.RUNNING, heartbeat_at=_ago(600))

    def down(*_a: Any) -> None:
        raise ConnectionError("broker down")

    (first,) = reaper.reap(store.engine, down, lambda: set(), stuck_after_s=180)
    assert row(store, sid).status == st.QUEUED and row(store, sid).task_id == first.task_id
    sent: list[str] = []
    # Still not in the broker once it has been quiet long enough: sent again.
    (second,) = reaper.reap(
        store.engine, lambda *a: sent.append(a[2]), lambda: set(), stuck_after_s=0
    )
    assert sent == [second.task_id] and row(store, sid).stuck_requeues == 2


def test_without_a_broker_to_ask_queued_rows_are_left_alone(store: st.SubmissionStore) -> None:
    sid, _ = add_job(store, "demo")
    _set(store, sid, created_at=_ago(3600))
    assert reaper.reap(store.engine, lambda *a: None, lambda: None, stuck_after_s=1) == []


def test_beat_sends_the_reaper_on_the_maint_queue() -> None:
    entry = ca.make_celery("redis://127.0.0.1:6379/0").conf.beat_schedule["reap-stuck-jobs"]
    assert entry["task"] == ca.REAP_TASK == "workers.tasks.reap_stuck_jobs"
    assert entry["options"]["queue"] == ca.QUEUE_MAINT
    assert entry["schedule"] == reaper.REAP_INTERVAL_S
