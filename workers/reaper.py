"""Leases on submissions and the stuck-job reaper (docs/faults.md).

The database, not the broker, is the record of what must be graded. Each submission row holds
the id of the one Celery message allowed to grade it (``task_id``) and the job's last sign of
life (``heartbeat_at``):

* ``claim`` starts an attempt only for that message (an atomic compare-and-set), so a message
  the reaper has replaced can never grade the submission a second time;
* ``beat`` is written every few seconds while a worker grades;
* ``reap`` (run by Celery beat through ``workers.tasks.reap_stuck_jobs``) finds rows whose job
  is gone and queues them again under a new message id:

  - ``running`` with a heartbeat older than ``stuck_after_s``: the worker was SIGKILLed, its
    pool process was cancelled on a broker connection loss (Celery then acknowledges the
    message as revoked), or a task died outside the grader;
  - ``queued`` for longer than ``stuck_after_s`` whose message is in no broker queue: lost with
    a broker restart, reserved by a worker that died, or never sent (the broker was down just
    after the commit). Only Redis can be asked; on other transports queued rows are left alone.

Every requeue adds one to the row's ``stuck_requeues`` and to ``REAPED`` (this process), and
``stuck_requeues_total`` sums the column for a metrics scrape from any process.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, and_, func, select, update

from workers.store import QUEUED, RUNNING, SubmissionStore, submissions_table, utcnow

log = logging.getLogger(__name__)

#: Seconds between heartbeats of a running job (``KGRADE_HEARTBEAT_S``).
HEARTBEAT_S = float(os.environ.get("KGRADE_HEARTBEAT_S") or 15)
#: A job silent this long is stuck (``KGRADE_STUCK_AFTER_S``): many missed heartbeats, so a
#: database hiccup of a minute does not requeue a job that is still grading.
STUCK_AFTER_S = float(os.environ.get("KGRADE_STUCK_AFTER_S") or 180)
#: Seconds between two runs of the reaper in the beat schedule (``KGRADE_REAP_INTERVAL_S``).
REAP_INTERVAL_S = float(os.environ.get("KGRADE_REAP_INTERVAL_S") or 60)
#: Requeues done by this process, by the state the row was stuck in ("running", "queued").
REAPED: Counter[str] = Counter()


@dataclass(frozen=True)
class Reaped:
    """One stuck submission queued again."""

    submission_id: int
    was: str  # "running" or "queued"
    queue: str
    task_id: str


def claim(engine: Engine, submission_id: int, task_id: str | None) -> int | None:
    """Start an attempt for message ``task_id``; its attempt number, or None when the
    submission is final, gone, or now belongs to another message (the reaper replaced this
    one). A row without a task id (made outside the API) accepts any message."""
    return SubmissionStore(engine=engine).start_attempt(submission_id, task_id)


def owner(engine: Engine, submission_id: int) -> str | None:
    t = submissions_table
    with engine.connect() as conn:
        return conn.execute(select(t.c.task_id).where(t.c.id == submission_id)).scalar()


def beat(engine: Engine, submission_id: int) -> bool:
    """Record that the running job is alive; False once it is final (nothing to keep)."""
    t = submissions_table
    with engine.begin() as conn:
        return bool(
            conn.execute(
                update(t)
                .where(t.c.id == submission_id, t.c.status == RUNNING)
                .values(heartbeat_at=utcnow())
            ).rowcount
        )


def mark_unsent(engine: Engine, submission_id: int) -> None:
    """The message could not be sent after the commit: say so on the row, which stays queued
    (the reaper sends it once the broker is back)."""
    t = submissions_table
    with engine.begin() as conn:
        conn.execute(
            update(t)
            .where(t.c.id == submission_id, t.c.status == QUEUED)
            .values(progress_phase="unsent")
        )


def stuck(
    engine: Engine, stuck_after_s: float, in_broker: Callable[[], set[str] | None]
) -> list[Any]:
    """Rows whose job is gone (see the module docstring). ``in_broker`` gives the message ids
    waiting in the broker's queues, or None when the broker cannot be asked."""
    t = submissions_table
    cutoff = utcnow() - timedelta(seconds=stuck_after_s)
    running = and_(t.c.status == RUNNING, func.coalesce(t.c.heartbeat_at, t.c.started_at) < cutoff)
    queued = and_(t.c.status == QUEUED, func.coalesce(t.c.heartbeat_at, t.c.created_at) < cutoff)
    cols = (t.c.id, t.c.status, t.c.queue, t.c.task_id)
    with engine.connect() as conn:
        rows = list(conn.execute(select(*cols).where(running).order_by(t.c.id)))
        old_queued = list(conn.execute(select(*cols).where(queued).order_by(t.c.id)))
    if old_queued:
        waiting = in_broker()
        if waiting is not None:
            rows += [r for r in old_queued if r.task_id not in waiting]
    return rows


def reap(
    engine: Engine,
    send: Callable[[int, str, str], None],
    in_broker: Callable[[], set[str] | None],
    stuck_after_s: float = STUCK_AFTER_S,
) -> list[Reaped]:
    """Queue every stuck submission again under a new message id; what was requeued.

    Each row is taken over with a compare-and-set on its old message id and state, so a job
    that came back to life (or another reaper) in between keeps it. ``send(submission_id,
    queue, task_id)`` runs after that commit; if it fails the row stays queued under the new id
    and the next run tries again.
    """
    t = submissions_table
    done: list[Reaped] = []
    for row in stuck(engine, stuck_after_s, in_broker):
        new_id = str(uuid.uuid4())
        same_owner = t.c.task_id.is_(None) if row.task_id is None else t.c.task_id == row.task_id
        with engine.begin() as conn:
            taken = conn.execute(
                update(t)
                .where(t.c.id == row.id, t.c.status == row.status, same_owner)
                .values(
                    status=QUEUED,
                    task_id=new_id,
                    heartbeat_at=utcnow(),
                    stuck_requeues=t.c.stuck_requeues + 1,
                    progress_phase="requeued",
                    progress_done=0,
                    progress_total=None,
                )
            ).rowcount
        if not taken:
            continue
        REAPED[row.status] += 1
        log.warning(
            "submission %s was stuck %s (message %s); queued again as %s",
            row.id,
            row.status,
            row.task_id,
            new_id,
        )
        try:
            send(row.id, row.queue, new_id)
        except Exception:  # noqa: BLE001 - the row is queued under new_id; the next run resends
            log.exception("could not send submission %s again", row.id)
        done.append(Reaped(row.id, row.status, row.queue, new_id))
    return done


def stuck_requeues_total(engine: Engine) -> int:
    """All requeues of stuck jobs so far, from the database (any process can read it)."""
    t = submissions_table
    with engine.connect() as conn:
        return int(conn.execute(select(func.coalesce(func.sum(t.c.stuck_requeues), 0))).scalar())


def redis_waiting_ids(client: Any, queue_keys: Iterable[str]) -> set[str]:
    """Message ids waiting in kombu's Redis lists ``queue_keys`` (JSON messages, protocol 2)."""
    ids: set[str] = set()
    for key in queue_keys:
        for raw in client.lrange(key, 0, -1):
            try:
                ids.add(str(json.loads(raw)["headers"]["id"]))
            except (ValueError, KeyError, TypeError):
                continue  # not a Celery message: nothing of ours
    return ids
