"""Kernel-exercise submissions: accept a source, queue it for grading, report on it, rank it.

The tables are ``workers.store``'s; grading is the Celery task ``workers.tasks.grade_submission``
(it takes the submission id), sent only once the transaction holding the row commits. A
submission belongs to a course: students see their own and their course's leaderboard.

Rate limit: ``service.extensions.SUBMISSIONS`` on the API view (flask-limiter, per student,
``KGRADE_SUBMISSION_RATE``), checked before anything is stored; only accepted submissions count.

Broker faults (docs/faults.md): with the broker unreachable a submission is refused with 503
and ``Retry-After`` before anything is stored (no row, no rate-limit slot used). Should the
send still fail after the commit (the broker went down in between), the row stays ``queued``
with progress phase ``unsent`` and the stuck-job reaper sends it once the broker is back, so
the 202 the caller got stays true.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from service.auth import Principal
from service.core import assignments as assignments_
from service.core import grades
from service.core.errors import ServiceError, forbidden, invalid, not_found
from service.core.tasks import after_commit
from service.db.base import utcnow
from service.db.courses import Assignment, Membership
from service.db.submissions import submissions
from workers.exercises import Exercise, ExerciseError, load_exercise
from workers.queues import queue_for
from workers.store import DONE, QUEUED, SubmissionStore, as_utc

log = logging.getLogger(__name__)

#: Largest accepted source, in bytes of UTF-8 (``KGRADE_MAX_SOURCE_BYTES``).
DEFAULT_MAX_SOURCE_BYTES = 256 * 1024
#: Retry-After of the 503 sent while the broker is unreachable (``KGRADE_BROKER_RETRY_AFTER_S``).
DEFAULT_BROKER_RETRY_AFTER_S = 30


def setting(config: dict[str, Any], key: str, env: str, default: Any) -> Any:
    """App config (tests pass overrides), then the environment, then the default."""
    value = config.get(key)
    if value is None:
        value = os.environ.get(env) or default
    return value


def max_source_bytes(config: dict[str, Any]) -> int:
    return int(
        setting(config, "MAX_SOURCE_BYTES", "KGRADE_MAX_SOURCE_BYTES", DEFAULT_MAX_SOURCE_BYTES)
    )


def grade_device(config: dict[str, Any]) -> str:
    """Where submissions are graded: ``cpu`` (default; CPU workers) or ``cuda`` (GPU workers)."""
    device = str(setting(config, "GRADE_DEVICE", "KGRADE_GRADE_DEVICE", "cpu"))
    if device not in ("cpu", "cuda"):
        raise RuntimeError(f"KGRADE_GRADE_DEVICE must be cpu or cuda, not {device!r}")
    return device


def exercise(exercise_id: str) -> Exercise:
    try:
        return load_exercise(exercise_id)
    except ExerciseError:
        raise not_found("exercise_id", f"unknown exercise {exercise_id!r}") from None


def decode_source(raw: bytes, limit: int, location: str, field: str) -> str:
    """The source as text, or a 4xx naming the field: too big, empty, not UTF-8, NUL."""
    if len(raw) > limit:
        raise invalid(location, field, f"source is over the limit of {limit} bytes", status=413)
    if not raw.strip():
        raise invalid(location, field, "the source is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(location, field, f"is not valid UTF-8 (byte {exc.start})") from None
    if "\x00" in text:
        raise invalid(location, field, "contains a NUL character")
    return text


def clean_filename(filename: str | None) -> str | None:
    if filename is None:
        return None
    return os.path.basename(filename.replace("\\", "/"))[:255] or None


def create(
    session: Session,
    actor: Principal,
    ex: Exercise,
    source: str,
    filename: str | None,
    config: dict[str, Any],
    *,
    reference: bool = False,
    assignment: Assignment | None = None,
) -> dict[str, Any]:
    """Store a submission and queue its grading (after the commit); its id, status, queue."""
    if reference and not actor.is_instructor:
        raise forbidden("only instructors may grade the reference")
    if assignment is not None and assignment.resource_id != ex.id:
        raise invalid("form", "assignment", "this assignment is for another exercise")
    assignments_.check_open(assignment, actor, "submissions")
    # The per-student rate limit is the view's (service.extensions.SUBMISSIONS, flask-limiter):
    # a refused submission never gets here, so nothing of it is stored.
    return _insert(session, actor, ex, source, filename, config, reference, assignment)


def _insert(
    session: Session,
    actor: Principal,
    ex: Exercise,
    source: str,
    filename: str | None,
    config: dict[str, Any],
    reference: bool,
    assignment: Assignment | None,
) -> dict[str, Any]:
    device = grade_device(config)
    queue = queue_for(device, ex.world_size)
    check_broker(config)
    task_id = str(uuid.uuid4())
    submission_id = session.execute(
        insert(submissions)
        .values(
            exercise_id=ex.id,
            course_id=actor.course_id,
            user_id=actor.user_id,
            student=actor.name,
            assignment_id=assignment.id if assignment is not None else None,
            token_id=actor.token_id,
            source=source,
            source_sha256=hashlib.sha256(source.encode("utf-8")).hexdigest(),
            filename=filename,
            reference=reference,
            device=device,
            queue=queue,
            status=QUEUED,
            task_id=task_id,
            attempts=0,
            progress_phase="queued",
            progress_done=0,
            created_at=utcnow(),
        )
        .returning(submissions.c.id)
    ).scalar_one()
    _enqueue_grading(session, submission_id, queue, task_id)
    if assignment is not None and not actor.is_instructor:
        grades.grade_event(
            session,
            assignment.id,
            actor.user_id,
            f"submission:{submission_id}:queued",
            pending=True,
        )
    return {"id": submission_id, "status": QUEUED, "queue": queue}


def check_broker(config: dict[str, Any]) -> None:
    """503 with Retry-After while no message can be sent: the caller retries, nothing is kept."""
    from workers.celery_app import broker_reachable  # the Celery app loads on first use

    if broker_reachable():
        return
    retry = int(
        setting(
            config,
            "BROKER_RETRY_AFTER_S",
            "KGRADE_BROKER_RETRY_AFTER_S",
            DEFAULT_BROKER_RETRY_AFTER_S,
        )
    )
    raise ServiceError(
        503,
        f"the grading queue is unavailable; nothing was stored, submit again in {retry} s",
        headers={"Retry-After": str(retry)},
    )


def _enqueue_grading(session: Session, submission_id: int, queue: str, task_id: str) -> None:
    engine = session.get_bind()

    def send() -> None:
        from service.logs import current_request_id
        from workers.reaper import mark_unsent
        from workers.tasks import grade_submission  # the Celery app loads on first use

        try:
            grade_submission.apply_async(
                args=[submission_id],
                # The API request's id, so the worker's log lines of this grading carry it.
                kwargs={"request_id": current_request_id()},
                queue=queue,
                task_id=task_id,
            )
        except Exception:  # noqa: BLE001 - the row is committed: the reaper sends it later
            log.exception("could not enqueue submission %s; the reaper will", submission_id)
            try:
                mark_unsent(engine, submission_id)
            except Exception:  # noqa: BLE001 - the row is queued either way
                log.exception("could not mark submission %s unsent", submission_id)

    after_commit(session, send)


def get(session: Session, actor: Principal, submission_id: int) -> Any:
    """The submission row, if the actor may see it (own, or their course's as instructor)."""
    t = submissions
    row = session.execute(select(t).where(t.c.id == submission_id)).first()
    if row is None or row.course_id != actor.course_id:
        raise not_found("submission_id", f"unknown submission {submission_id}")
    if not actor.is_instructor and row.user_id != actor.user_id:
        raise forbidden("this submission belongs to another student")
    return row


def final_result(session: Session, row: Any) -> dict[str, Any] | None:
    if row.status != DONE or row.result_attempt is None:
        return None
    r = SubmissionStore(engine=session.get_bind()).results(row.id)
    return next((x["result"] for x in r if x["attempt"] == row.result_attempt), None)


def visible_result(result: dict[str, Any] | None, actor: Principal) -> dict[str, Any] | None:
    """What the actor may see of results.json: students get it without staff-only parts."""
    if result is None or actor.is_instructor:
        return result
    shown = dict(result)
    staff = dict(shown.get("kgrade") or {})
    for key in ("logs", "details", "harness_hash", "run_id"):
        staff.pop(key, None)
    if staff:
        shown["kgrade"] = staff
    else:
        shown.pop("kgrade", None)
    return shown


def view(row: Any, result: dict[str, Any] | None, actor: Principal) -> dict[str, Any]:
    return {
        "id": row.id,
        "exercise_id": row.exercise_id,
        "student": row.student,
        "assignment_id": row.assignment_id,
        "filename": row.filename,
        "reference": row.reference,
        "source_sha256": row.source_sha256,
        "status": row.status,
        "device": row.device,
        "queue": row.queue,
        "attempts": row.attempts,
        "progress": {
            "phase": row.progress_phase,
            "done": row.progress_done,
            "total": row.progress_total,
        },
        "verdict": row.verdict,
        "score": row.score,
        "speedup": row.speedup,
        "gradable": row.gradable,
        "created_at": as_utc(row.created_at),
        "started_at": as_utc(row.started_at),
        "finished_at": as_utc(row.finished_at),
        "result": visible_result(result, actor) if row.status == DONE else None,
    }


def queue_position(session: Session, row: Any) -> int | None:
    """1 for the next to be graded in its queue; None once it left the queue."""
    if row.status != QUEUED:
        return None
    t = submissions
    ahead = session.execute(
        select(func.count()).where(t.c.queue == row.queue, t.c.status == QUEUED, t.c.id < row.id)
    ).scalar_one()
    return int(ahead) + 1


def history(
    session: Session,
    actor: Principal,
    exercise_id: str,
    assignment: Assignment | None = None,
    user_id: int | None = None,
) -> list[Any]:
    """The actor's (or, for an instructor, ``user_id``'s) submissions to an exercise, newest
    first."""
    t = submissions
    uid = user_id if (user_id is not None and actor.is_instructor) else actor.user_id
    stmt = select(t).where(
        t.c.course_id == actor.course_id, t.c.user_id == uid, t.c.exercise_id == exercise_id
    )
    if assignment is not None:
        stmt = stmt.where(t.c.assignment_id == assignment.id)
    return list(session.execute(stmt.order_by(t.c.id.desc())).all())


def leaderboard(session: Session, actor: Principal, exercise_id: str) -> list[dict[str, Any]]:
    """The course's students ranked by their best passing, confirmed speedup.

    Students see their own name; other students' are null. Instructors' own runs never rank.
    """
    t = submissions
    students = select(Membership.user_id).where(
        Membership.course_id == actor.course_id, Membership.role == "student"
    )
    rows = session.execute(
        select(t.c.id, t.c.user_id, t.c.student, t.c.speedup, t.c.score, t.c.finished_at)
        .where(
            t.c.course_id == actor.course_id,
            t.c.exercise_id == exercise_id,
            t.c.verdict == "PASS",
            t.c.speedup.is_not(None),
            t.c.reference.is_(False),
            t.c.user_id.in_(students),
        )
        .order_by(t.c.speedup.desc(), t.c.finished_at.asc(), t.c.id.asc())
    ).all()
    entries: list[dict[str, Any]] = []
    seen: set[int] = set()
    for row in rows:
        if row.user_id in seen:
            continue
        seen.add(row.user_id)
        own = actor.is_instructor or row.user_id == actor.user_id
        entries.append(
            {
                "rank": len(entries) + 1,
                "student": row.student if own else None,
                "submission_id": row.id if own else None,
                "you": row.user_id == actor.user_id,
                "speedup": row.speedup,
                "score": row.score,
                "finished_at": as_utc(row.finished_at) or datetime.min,
            }
        )
    return entries


def regrade(session: Session, actor: Principal, row: Any, config: dict[str, Any]) -> dict[str, Any]:
    """Grade a submission's source again as a new submission of the same student (an
    instructor's action: it counts like the student's own, and goes to the LMS)."""
    if not actor.is_instructor:
        raise forbidden("only instructors regrade")
    ex = exercise(row.exercise_id)
    student = Principal(
        token_id=None,
        name=row.student,
        role="student",
        user_id=row.user_id,
        course_id=row.course_id,
    )
    assignment = session.get(Assignment, row.assignment_id) if row.assignment_id else None
    # The instructor acts: no rate limit, no due date.
    created = _insert(
        session, student, ex, row.source, row.filename, config, row.reference, assignment
    )
    return created


def known_solutions(session: Session, actor: Principal, ex: Exercise) -> list[dict[str, Any]]:
    """The exercise's known solutions with their expected verdict and, for each, this course's
    latest grading of exactly that source."""
    t = submissions
    out = []
    for sol in ex.solutions():
        source = sol.source()
        digest = hashlib.sha256(source.encode("utf-8")).hexdigest()
        last = session.execute(
            select(t)
            .where(
                t.c.course_id == actor.course_id,
                t.c.exercise_id == ex.id,
                t.c.source_sha256 == digest,
            )
            .order_by(t.c.id.desc())
            .limit(1)
        ).first()
        out.append(
            {
                "name": sol.name,
                "expected": sol.expected.value,
                "last": last,
                "matches": last is not None and last.verdict == sol.expected.value,
            }
        )
    return out
