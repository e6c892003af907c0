"""Helpers of the fault tests (tests/workers/test_faults*.py): a PostgreSQL schema of their own,
real Celery worker processes running the stand-in grader of ``fault_stub``, and waiting."""

from __future__ import annotations

import os
import secrets
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, select, text, update

from tests.conftest import stop_group
from tests.workers.conftest import add_queued_submission
from workers import store as st
from workers.queues import QUEUE_CPU, QUEUE_MAINT, worker_argv

ROOT = Path(__file__).resolve().parents[2]
STUB = Path(__file__).resolve().parent / "fault_stub"


@contextmanager
def pg_store(postgres_url: str) -> Iterator[st.SubmissionStore]:
    """The worker's tables in a throwaway PostgreSQL schema (dropped afterwards)."""
    name = f"kgf_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{name}"'))
    sep = "&" if "?" in postgres_url else "?"
    store = st.SubmissionStore(f"{postgres_url}{sep}options=-csearch_path%3D{name}")
    st._metadata.create_all(store.engine)
    try:
        yield store
    finally:
        store.engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        admin.dispose()


def add_job(store: st.SubmissionStore, exercise_id: str) -> tuple[int, str]:
    """A queued submission (the stub grades any exercise id) owned by a new message id."""
    sid = add_queued_submission(store, f"# {exercise_id}\n", exercise_id=exercise_id)
    task_id = str(uuid.uuid4())
    t = st.submissions_table
    with store.engine.begin() as conn:
        conn.execute(update(t).where(t.c.id == sid).values(task_id=task_id))
    return sid, task_id


def row(store: st.SubmissionStore, sid: int) -> Any:
    t = st.submissions_table
    with store.engine.connect() as conn:
        return conn.execute(select(t).where(t.c.id == sid)).one()


def stub_lines(log: Path, kind: str, exercise_id: str) -> int:
    """How many gradings of ``exercise_id`` the stub began (``start``) or finished (``done``)."""
    if not log.exists():
        return 0
    return sum(1 for ln in log.read_text().splitlines() if ln.split()[:2] == [kind, exercise_id])


def worker_env(tmp: Path, redis_url: str, db_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(
        REDIS_URL=redis_url,
        KGRADE_REDIS_KEYPREFIX=f"kgf-{os.getpid()}-{uuid.uuid4().hex[:8]}:",
        DATABASE_URL=db_url,
        KGRADE_VAR_DIR=str(tmp / "var"),
        PYTHONPATH=str(STUB),
        KGRADE_STUB_LOG=str(tmp / "stub.log"),
        # Fast fault detection for a test: beats every 0.5 s, stuck after 3 s, reaped each 1 s.
        KGRADE_HEARTBEAT_S="0.5",
        KGRADE_STUCK_AFTER_S="3",
        KGRADE_REAP_INTERVAL_S="1",
    )
    env.update(extra)
    return env


def wait_for(what: str, cond: Callable[[], Any], timeout: float, log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = log.read_text()[-4000:] if log and log.exists() else ""
            raise AssertionError(f"timed out waiting for {what}\n{tail}")
        time.sleep(0.2)


class Worker:
    """One grading worker process (``worker_argv``, as deployed), optionally with beat."""

    def __init__(self, env: dict[str, str], tmp: Path, *, beat: bool = False) -> None:
        self.log = tmp / f"worker-{secrets.token_hex(3)}.log"
        schedule = str(tmp / f"beat-{secrets.token_hex(3)}") if beat else None
        argv = worker_argv(
            [QUEUE_CPU, QUEUE_MAINT], f"fault-{uuid.uuid4().hex[:6]}@%h", beat_schedule=schedule
        )
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for("the worker", lambda: b" ready." in self.log.read_bytes(), 60, self.log)

    def stop(self) -> None:
        stop_group(self.proc)


def sender(redis_url: str, env: dict[str, str]) -> Any:
    """A Celery app of this process with the workers' broker settings, to send messages."""
    from workers import celery_app as ca

    old = os.environ.get("KGRADE_REDIS_KEYPREFIX")
    os.environ["KGRADE_REDIS_KEYPREFIX"] = env["KGRADE_REDIS_KEYPREFIX"]
    try:
        return ca.make_celery(redis_url)
    finally:
        if old is None:
            os.environ.pop("KGRADE_REDIS_KEYPREFIX", None)
        else:
            os.environ["KGRADE_REDIS_KEYPREFIX"] = old


def send(app: Any, sid: int, task_id: str) -> Any:
    return app.send_task(
        "workers.tasks.grade_submission", args=[sid], queue=QUEUE_CPU, task_id=task_id
    )
