"""The LMS-facing Celery tasks (queue ``lti``): grade passback, a grading's end, roster sync.

Each takes ids, opens its own session, and is idempotent: a passback row already sent is not
posted again, and a retry posts the same score with the same timestamp. Transient platform
errors are retried with exponential backoff and jitter (honouring ``Retry-After``); a refusal
is stored on the row with the platform's reason for the instructor to see.

Run by ``celery -A service.worker worker -Q lti`` (``kgrade serve`` starts one beside the API
when no broker server is configured).
"""

from __future__ import annotations

import logging
import random
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core import grades, people
from service.core.tasks import PASSBACK_TASK, ROSTER_TASK, task_session
from service.db.base import utcnow
from service.db.courses import Assignment, Course, User
from service.db.lti import (
    PASSBACK_FAILED,
    PASSBACK_SENT,
    GradePassback,
    LtiPlatform,
)
from service.db.submissions import submissions
from service.lti import ags
from service.lti.context import map_role
from service.metrics import count_passback
from workers.celery_app import app
from workers.queues import GRADED_TASK

log = logging.getLogger(__name__)

#: Deliveries of one passback before it is marked failed (about an hour of backoff in all).
MAX_TRIES = 8
#: Passbacks a platform refused as superseded: it holds a newer score (not an error).
SUPERSEDED = "superseded"


def backoff(tries: int, retry_after: float | None) -> float:
    """Seconds before the next try: the platform's Retry-After, else 2^tries with jitter."""
    base = min(900.0, 2.0 ** max(1, tries))
    wait = base * (0.5 + random.random() / 2)
    return max(wait, retry_after or 0.0)


def score_body(row: GradePassback, user: User) -> dict[str, Any]:
    body: dict[str, Any] = {
        "userId": user.sub,
        "scoreMaximum": row.score_maximum,
        "activityProgress": row.activity_progress,
        "gradingProgress": row.grading_progress,
        "timestamp": row.timestamp,
    }
    if row.score_given is not None:
        body["scoreGiven"] = row.score_given
    if row.comment:
        body["comment"] = row.comment
    return body


def send(session: Session, passback_id: int) -> tuple[str, float | None]:
    """Post one passback. Returns its status and, when it should be tried again later, after
    how many seconds."""
    row = session.get(GradePassback, passback_id)
    if row is None:
        return "missing", None
    if row.status in (PASSBACK_SENT, SUPERSEDED):
        return row.status, None
    assignment = session.get(Assignment, row.assignment_id)
    course = session.get(Course, assignment.course_id) if assignment else None
    platform = (
        session.get(LtiPlatform, course.platform_id) if course and course.platform_id else None
    )
    user = session.get(User, row.user_id)
    if assignment is None or course is None or platform is None or user is None:
        return _finish(
            session, row, PASSBACK_FAILED, None, "the course is no longer linked to an LMS"
        )
    row.tries += 1
    row.updated_at = utcnow()
    # Counted before the call, and no write lock held while the platform answers.
    session.commit()
    conn = ags.Connector(session, platform)
    try:
        lineitem = ags.lineitem_for(session, conn, course, assignment)
        status = ags.post_score(conn, course, lineitem, score_body(row, user))
    except ags.Transient as exc:
        row.error, row.http_status = str(exc), exc.status
        if row.tries >= MAX_TRIES:
            return _finish(
                session, row, PASSBACK_FAILED, exc.status, f"gave up after {row.tries} tries: {exc}"
            )
        session.commit()
        count_passback("retry")
        return row.status, backoff(row.tries, exc.retry_after)
    except ags.Superseded as exc:
        return _finish(session, row, SUPERSEDED, exc.status, str(exc))
    except ags.Refused as exc:
        log.warning("passback %s refused: %s", row.id, exc)
        if exc.status == 404:
            # The grade column is gone (deleted in the LMS): forget it, so that a re-send finds
            # or makes the column again instead of posting into the void.
            ags.forget_lineitem(session, course, assignment)
        return _finish(session, row, PASSBACK_FAILED, exc.status, str(exc))
    return _finish(session, row, PASSBACK_SENT, status, None)


def _finish(
    session: Session, row: GradePassback, status: str, http_status: int | None, error: str | None
) -> tuple[str, None]:
    row.status, row.http_status, row.error = status, http_status, error
    row.updated_at = utcnow()
    if status == PASSBACK_SENT:
        row.sent_at = row.updated_at
    session.commit()
    count_passback(status)  # sent, superseded or failed (kgrade_grade_passbacks_total)
    return status, None


@app.task(bind=True, name=PASSBACK_TASK, max_retries=MAX_TRIES, acks_late=True)
def send_passback(self: Any, passback_id: int) -> dict[str, Any]:
    with task_session() as session:
        status, retry_in = send(session, passback_id)
    if retry_in is not None:
        raise self.retry(countdown=retry_in)
    return {"passback_id": passback_id, "status": status}


def submission_finished(session: Session, submission_id: int) -> GradePassback | None:
    """Record the grade event of an assignment's submission that got its final result."""
    t = submissions
    row = session.execute(
        select(t.c.assignment_id, t.c.user_id, t.c.verdict, t.c.speedup).where(
            t.c.id == submission_id
        )
    ).first()
    if row is None or row.assignment_id is None:
        return None
    comment = f"{row.verdict}" + (f", {row.speedup:.2f}x the reference" if row.speedup else "")
    event = grades.grade_event(
        session,
        row.assignment_id,
        row.user_id,
        f"submission:{submission_id}:graded",
        comment=comment,
    )
    session.commit()
    return event


@app.task(name=GRADED_TASK, acks_late=True)
def grading_finished(submission_id: int) -> dict[str, Any]:
    with task_session() as session:
        event = submission_finished(session, submission_id)
    return {"submission_id": submission_id, "passback_id": event.id if event else None}


def sync_roster(session: Session, course_id: int) -> int:
    """Fetch the course's members (NRPS, all pages) into memberships; how many were read."""
    course = session.get(Course, course_id)
    if course is None or not course.nrps_url or course.platform_id is None:
        return 0
    platform = session.get(LtiPlatform, course.platform_id)
    assert platform is not None and course.issuer is not None
    conn = ags.Connector(session, platform)
    n = 0
    try:
        for m in ags.memberships(conn, course.nrps_url):
            role = map_role([r for r in m.get("roles") or [] if isinstance(r, str)])
            if role is None or not m.get("user_id"):
                continue
            name = (
                m.get("name")
                or " ".join(x for x in (m.get("given_name"), m.get("family_name")) if x)
                or None
            )
            user = people.lti_user(session, course.issuer, str(m["user_id"]), name, m.get("email"))
            status = str(m.get("status") or "Active").lower()
            people.enrol(
                session,
                course,
                user,
                role,
                source="roster",
                lti_roles=m.get("roles") or [],
                status=status if status in ("active", "inactive", "deleted") else "active",
            )
            n += 1
    except ags.PlatformError as exc:
        session.rollback()
        course = session.get(Course, course_id)
        assert course is not None
        course.roster_error = str(exc)[:1000]
        session.commit()
        raise
    course.roster_synced_at = utcnow()
    course.roster_error = None
    session.commit()
    return n


@app.task(bind=True, name=ROSTER_TASK, max_retries=3, acks_late=True)
def roster_task(self: Any, course_id: int) -> dict[str, Any]:
    with task_session() as session:
        try:
            n = sync_roster(session, course_id)
        except ags.Transient as exc:
            raise self.retry(countdown=backoff(self.request.retries + 1, exc.retry_after)) from exc
        except ags.PlatformError as exc:
            return {"course_id": course_id, "error": str(exc)}
    return {"course_id": course_id, "members": n}
