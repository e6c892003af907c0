"""Submission tables and the persistence port the grading task uses.

The tables are defined once, here, by ``define_tables(metadata)``:

* the service registers them on its declarative ``Base.metadata`` (``service/db/submissions.py``),
  so Alembic, ``create_all`` and the API see them like any other kgrade table;
* the worker builds them on a private ``MetaData`` and talks to the same database with plain
  SQLAlchemy Core (``SubmissionStore``), so ``workers`` never imports Flask or ``service``.

Dependencies keep pointing one way: service -> workers -> kernels.

Writes are idempotent: a result is an upsert on (submission id, attempt), and the submission's
final verdict is set only while it is not yet final, so a redelivered or duplicated task can
neither create a second result for an attempt nor overwrite the first final verdict.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.engine import make_url

# Submission status. "queued" until a worker starts it, "running" while graded, then "done".
QUEUED = "queued"
RUNNING = "running"
DONE = "done"
STATUSES: tuple[str, ...] = (QUEUED, RUNNING, DONE)

SUBMISSIONS = "submissions"
RESULTS = "submission_results"


def define_tables(metadata: MetaData, *, foreign_keys: bool = True) -> tuple[Table, Table]:
    """Create the ``submissions`` and ``submission_results`` tables on ``metadata``.

    ``foreign_keys=False`` leaves out the references to the service's tables (tokens, courses,
    users, assignments), which the worker's private metadata does not know (the database still
    enforces them).
    """

    def fk(target: str, **kw: Any) -> list[ForeignKey]:
        return [ForeignKey(target, **kw)] if foreign_keys else []

    submissions = Table(
        SUBMISSIONS,
        metadata,
        Column("id", Integer, primary_key=True),
        Column("exercise_id", String(64), nullable=False),
        # Every submission belongs to one course and one user (as quiz attempts do); ``student``
        # is the name shown, the token (null from a page) says what sent it.
        Column("course_id", Integer, *fk("courses.id"), nullable=False),
        Column("user_id", Integer, *fk("users.id"), nullable=False),
        Column("student", String(200), nullable=False),
        # The assignment it was made for (its grade goes to that LMS column), or null.
        Column(
            "assignment_id", String(32), *fk("assignments.id", ondelete="SET NULL"), nullable=True
        ),
        Column("token_id", Integer, *fk("api_tokens.id"), nullable=True),
        Column("source", Text, nullable=False),
        Column("source_sha256", String(64), nullable=False),
        Column("filename", String(255), nullable=True),
        # An instructor's run of the exercise's own reference (trusted: may import kernels);
        # checks the harness (speedup ~1.0) and never appears on the leaderboard.
        Column("reference", Boolean, nullable=False, default=False),
        Column("device", String(8), nullable=False),
        Column("queue", String(16), nullable=False),
        Column("status", String(16), nullable=False, default=QUEUED),
        Column("task_id", String(64), nullable=True),
        # Deliveries that started grading; capped in workers.tasks (spec section 8).
        Column("attempts", Integer, nullable=False, default=0),
        # Last sign of life of the job: set when it is queued (again) and every few seconds
        # while a worker grades it; the stuck-job reaper (workers.reaper) requeues a row whose
        # heartbeat is older than its threshold.
        Column("heartbeat_at", DateTime(timezone=True), nullable=True),
        # How often the reaper found this submission stuck and queued it again.
        Column("stuck_requeues", Integer, nullable=False, default=0, server_default="0"),
        Column("progress_phase", String(32), nullable=True),
        Column("progress_done", Integer, nullable=True),
        Column("progress_total", Integer, nullable=True),
        # Copied from the final result for listing and the leaderboard without reading JSON.
        Column("verdict", String(32), nullable=True),
        Column("score", Float, nullable=True),
        Column("speedup", Float, nullable=True),
        Column("gradable", Boolean, nullable=True),
        Column("result_attempt", Integer, nullable=True),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("started_at", DateTime(timezone=True), nullable=True),
        Column("finished_at", DateTime(timezone=True), nullable=True),
        Index("ix_submissions_student", "student"),
        Index("ix_submissions_course_user", "course_id", "user_id"),
        Index("ix_submissions_exercise_verdict", "exercise_id", "verdict"),
    )
    results = Table(
        RESULTS,
        metadata,
        Column("id", Integer, primary_key=True),
        Column(
            "submission_id",
            Integer,
            ForeignKey(f"{SUBMISSIONS}.id", ondelete="CASCADE"),
            nullable=False,
        ),
        Column("attempt", Integer, nullable=False),
        Column("verdict", String(32), nullable=False),
        Column("score", Float, nullable=False),
        Column("gradable", Boolean, nullable=False),
        # results.json of spec section 10, plus the run record (versions, seeds hash, samples).
        Column("result", JSON, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False),
        UniqueConstraint("submission_id", "attempt", name="uq_submission_results_attempt"),
    )
    return submissions, results


_metadata = MetaData()
submissions_table, results_table = define_tables(_metadata, foreign_keys=False)


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every timestamp kgrade writes is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def database_url() -> str:
    """The database the API uses: ``DATABASE_URL``, else ``var/kgrade.sqlite3`` in the cwd.

    Mirrors ``service.config`` (which workers may not import), including the rewrite of bare
    ``postgresql://`` URLs to the psycopg 3 driver.
    """
    url = (
        os.environ.get("DATABASE_URL") or f"sqlite:///{(Path('var') / 'kgrade.sqlite3').resolve()}"
    )
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(url, connect_args={"timeout": 30})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # The API and the worker write one SQLite file from different processes: wait for
        # locks instead of failing, and use WAL so API reads proceed during a worker write.
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    return engine


@dataclass(frozen=True)
class Submission:
    """What the task needs of a submission row."""

    id: int
    exercise_id: str
    student: str
    source: str
    device: str
    queue: str
    status: str
    attempts: int
    verdict: str | None
    reference: bool = False
    assignment_id: str | None = None


class SubmissionStore:
    """The grading task's port to the submission tables (plain SQLAlchemy Core)."""

    def __init__(self, url: str | None = None, engine: Engine | None = None) -> None:
        self.engine = engine if engine is not None else make_engine(url or database_url())

    def get(self, submission_id: int) -> Submission | None:
        t = submissions_table
        with self.engine.connect() as conn:
            row = conn.execute(select(t).where(t.c.id == submission_id)).mappings().first()
        if row is None:
            return None
        return Submission(
            id=row["id"],
            exercise_id=row["exercise_id"],
            student=row["student"],
            source=row["source"],
            device=row["device"],
            queue=row["queue"],
            status=row["status"],
            attempts=row["attempts"],
            verdict=row["verdict"],
            reference=bool(row["reference"]),
            assignment_id=row["assignment_id"],
        )

    def start_attempt(self, submission_id: int, task_id: str | None = None) -> int | None:
        """Count one more delivery that starts grading; its attempt number (1-based), or None
        when the submission is already final (or gone), or, with ``task_id``, now belongs to
        another message (the stuck-job reaper replaced this one). A row without a task id
        (made outside the API) accepts any message.

        One UPDATE increments in the database, so two deliveries racing each get their own
        number (the write lock is taken by the UPDATE, before the read).
        """
        t = submissions_table
        fence = or_(t.c.task_id.is_(None), t.c.task_id == task_id) if task_id else true()
        now = utcnow()
        with self.engine.begin() as conn:
            changed = conn.execute(
                _unless_final(submission_id)
                .where(fence)
                .values(
                    attempts=t.c.attempts + 1,
                    status=RUNNING,
                    started_at=now,
                    heartbeat_at=now,
                    progress_phase="starting",
                    progress_done=0,
                    progress_total=None,
                )
            ).rowcount
            if not changed:
                return None
            return int(
                conn.execute(select(t.c.attempts).where(t.c.id == submission_id)).scalar_one()
            )

    def set_progress(self, submission_id: int, phase: str, done: int, total: int | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                _unless_final(submission_id).values(
                    progress_phase=phase[:32], progress_done=done, progress_total=total
                )
            )

    def save_result(self, submission_id: int, attempt: int, result: dict[str, Any]) -> bool:
        """Upsert the result of ``attempt`` and make it final unless one already is.

        Returns True when this result became the submission's final one.
        """
        values = _result_row(submission_id, attempt, result)
        t = submissions_table
        with self.engine.begin() as conn:
            stmt = _upsert(conn.dialect.name, values)
            conn.execute(stmt)
            made_final = conn.execute(
                _unless_final(submission_id).values(
                    status=DONE,
                    verdict=values["verdict"],
                    score=values["score"],
                    gradable=values["gradable"],
                    speedup=_speedup(result),
                    result_attempt=attempt,
                    finished_at=values["created_at"],
                    progress_phase="done",
                    progress_done=t.c.progress_total,
                )
            ).rowcount
        return bool(made_final)

    def requeue(self, submission_id: int, attempt: int, result: dict[str, Any]) -> bool:
        """Keep ``attempt``'s result for the record (it carries ``requeued``: why) and put the
        submission back in the queue, unless a result is final already. True when requeued."""
        values = _result_row(submission_id, attempt, result)
        with self.engine.begin() as conn:
            changed = conn.execute(
                _unless_final(submission_id).values(
                    status=QUEUED, progress_phase="requeued", progress_done=0, progress_total=None
                )
            ).rowcount
            if changed:
                conn.execute(_upsert(conn.dialect.name, values))
        return bool(changed)

    def requeued(self, submission_id: int) -> int:
        """How many of the submission's attempts ended in a requeue (see ``requeue``)."""
        return sum(1 for r in self.results(submission_id) if (r["result"] or {}).get("requeued"))

    def results(self, submission_id: int) -> list[dict[str, Any]]:
        r = results_table
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(r).where(r.c.submission_id == submission_id).order_by(r.c.attempt)
            ).mappings()
            return [dict(row) for row in rows]


def _unless_final(submission_id: int) -> Any:
    """An UPDATE of the submission that changes nothing once its result is final."""
    t = submissions_table
    return update(t).where(t.c.id == submission_id, t.c.status != DONE)


def _result_row(submission_id: int, attempt: int, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "submission_id": submission_id,
        "attempt": attempt,
        "verdict": str(result["verdict"]),
        "score": float(result.get("score") or 0.0),
        "gradable": bool(result.get("gradable", True)),
        "result": result,
        "created_at": utcnow(),
    }


def _upsert(dialect: str, values: dict[str, Any]) -> Any:
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:  # pragma: no cover - kgrade runs on SQLite and PostgreSQL only
        raise RuntimeError(f"no upsert for {dialect}")
    stmt = insert(results_table).values(**values)
    changed = {
        k: stmt.excluded[k] for k in ("verdict", "score", "gradable", "result", "created_at")
    }
    return stmt.on_conflict_do_update(index_elements=["submission_id", "attempt"], set_=changed)


def _speedup(result: dict[str, Any]) -> float | None:
    """The ranking value: the ``speedup`` leaderboard entry of a passing result, if any."""
    if result.get("verdict") != "PASS":
        return None
    for entry in result.get("leaderboard") or []:
        if entry.get("name") == "speedup":
            try:
                return float(entry["value"])
            except (KeyError, TypeError, ValueError):
                return None
    return None
