"""Grades: per student and quiz or assignment, by policy (best or last); what goes to the LMS.

A student's grade in an assignment is the best or the last of their graded attempts (quizzes) or
gradable finished submissions (exercises), on the assignment's point scale. Each event that can
change it (an attempt submitted, a grading queued or finished, a regrade, a re-send) records one
``GradePassback`` row, posted to the LMS by its own task (``service.lti.tasks``).
"""

from __future__ import annotations

import csv
import io
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from item_bank.model import Quiz
from service import grading
from service.core import people
from service.core.tasks import PASSBACK_TASK, QUEUE_LTI, enqueue_after_commit
from service.db.attempts import SUBMITTED, Attempt
from service.db.base import utcnow
from service.db.courses import EXERCISE, LAST, STUDENT, Assignment, Course
from service.db.lti import PASSBACK_PENDING, GradePassback
from service.db.submissions import submissions
from workers.store import DONE, as_utc

# --- one student's grade in an assignment -----------------------------------------------------


@dataclass
class Graded:
    """One graded piece of work: an attempt or a submission, on the assignment's scale."""

    id: str
    points: float
    at: datetime


@dataclass
class Summary:
    """A student's work on one assignment or quiz."""

    user_id: int
    name: str
    graded: list[Graded] = field(default_factory=list)
    in_progress: int = 0
    status: str | None = None  # membership: active, inactive, deleted; None: not on the roster

    @property
    def best(self) -> Graded | None:
        # Ties go to the earlier one (rows come in time order).
        best = None
        for g in self.graded:
            if best is None or g.points > best.points:
                best = g
        return best

    @property
    def last(self) -> Graded | None:
        return self.graded[-1] if self.graded else None

    def grade(self, policy: str) -> float | None:
        pick = self.last if policy == LAST else self.best
        return pick.points if pick is not None else None


def _scale(points: float | None, maximum: float | None, to: float) -> float:
    if not points or not maximum:
        return 0.0
    return round(points / maximum * to, 6)


def summaries(
    session: Session, assignment: Assignment, user_ids: Iterable[int] | None = None
) -> dict[int, Summary]:
    """Every student's graded work on ``assignment`` (or only ``user_ids``'), by user id."""
    only = list(user_ids) if user_ids is not None else None
    out: dict[int, Summary] = {}
    if assignment.kind == EXERCISE:
        t = submissions
        stmt = (
            select(
                t.c.id,
                t.c.user_id,
                t.c.student,
                t.c.status,
                t.c.score,
                t.c.gradable,
                t.c.finished_at,
                t.c.created_at,
            )
            .where(t.c.assignment_id == assignment.id)
            .order_by(t.c.finished_at.is_(None), t.c.finished_at, t.c.id)
        )
        if only is not None:
            stmt = stmt.where(t.c.user_id.in_(only))
        for r in session.execute(stmt):
            s = out.setdefault(r.user_id, Summary(r.user_id, r.student))
            if r.status != DONE:
                s.in_progress += 1
            elif r.gradable:
                s.graded.append(
                    Graded(
                        str(r.id),
                        _scale(r.score, 1.0, assignment.score_maximum),
                        as_utc(r.finished_at) or utcnow(),
                    )
                )
    else:
        stmt = (
            select(
                Attempt.id,
                Attempt.user_id,
                Attempt.student,
                Attempt.status,
                Attempt.score,
                Attempt.max_score,
                Attempt.submitted_at,
            )
            .where(Attempt.assignment_id == assignment.id)
            .order_by(Attempt.submitted_at.is_(None), Attempt.submitted_at, Attempt.id)
        )
        if only is not None:
            stmt = stmt.where(Attempt.user_id.in_(only))
        for r in session.execute(stmt):
            s = out.setdefault(r.user_id, Summary(r.user_id, r.student))
            if r.status != SUBMITTED:
                s.in_progress += 1
            else:
                s.graded.append(
                    Graded(
                        r.id, _scale(r.score, r.max_score, assignment.score_maximum), r.submitted_at
                    )
                )
    return out


# --- passback events ----------------------------------------------------------------------------


def _timestamp(session: Session, assignment_id: str, user_id: int) -> str:
    """Now, as AGS wants it (milliseconds, offset), at least a whole second after this
    student's previous event: Moodle keeps whole seconds and refuses a score whose time is not
    later than the one it holds."""
    now = utcnow()
    prev = session.execute(
        select(func.max(GradePassback.timestamp)).where(
            GradePassback.assignment_id == assignment_id, GradePassback.user_id == user_id
        )
    ).scalar()
    if prev:
        floor = datetime.fromisoformat(prev).replace(microsecond=0) + timedelta(seconds=1)
        now = max(now, floor)
    return now.isoformat(timespec="milliseconds")


def grade_event(
    session: Session,
    assignment_id: str,
    user_id: int,
    event: str,
    *,
    pending: bool = False,
    comment: str | None = None,
) -> GradePassback | None:
    """Record the score to post for ``event`` (once per event) and send it after the commit.

    Nothing is recorded for an assignment no LMS grades (a local course). ``pending``: the work
    is queued for grading (``Submitted``/``Pending``); else the grade by the assignment's policy
    (``Completed``/``FullyGraded``), or ``Failed`` when no gradable result exists.
    """
    assignment = session.get(Assignment, assignment_id)
    if assignment is None:
        return None
    course = session.get(Course, assignment.course_id)
    if course is None or course.platform_id is None:
        return None
    summary = summaries(session, assignment, [user_id]).get(user_id)
    grade = summary.grade(assignment.policy) if summary else None
    if pending:
        activity, progress = "Submitted", "Pending"
    elif grade is None:
        activity, progress = "Completed", "Failed"
    else:
        activity, progress = "Completed", "FullyGraded"
    now = utcnow()
    row = GradePassback(
        event=event[:128],
        assignment_id=assignment_id,
        user_id=user_id,
        activity_progress=activity,
        grading_progress=progress,
        score_given=grade,
        score_maximum=assignment.score_maximum,
        comment=comment,
        timestamp=_timestamp(session, assignment_id, user_id),
        status=PASSBACK_PENDING,
        tries=0,
        created_at=now,
        updated_at=now,
    )
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:  # this event is recorded already: post it once, not twice
        return session.execute(
            select(GradePassback).where(GradePassback.event == event[:128])
        ).scalar_one()
    enqueue_after_commit(session, PASSBACK_TASK, [row.id], QUEUE_LTI)
    return row


def resend(session: Session, assignment: Assignment, user_ids: Iterable[int] | None = None) -> int:
    """Post every graded student's current grade again (``kgrade lti sync-grades``, the
    instructor's button): one new event per student. Returns how many were recorded."""
    batch = uuid.uuid4().hex[:12]
    n = 0
    for uid, s in summaries(session, assignment, user_ids).items():
        if s.graded and grade_event(session, assignment.id, uid, f"sync:{batch}:{uid}"):
            n += 1
    return n


def latest_passbacks(session: Session, assignment_id: str) -> dict[int, GradePassback]:
    """Each student's newest passback row for ``assignment_id``."""
    rows = session.execute(
        select(GradePassback)
        .where(GradePassback.assignment_id == assignment_id)
        .order_by(GradePassback.user_id, GradePassback.id)
    ).scalars()
    return {r.user_id: r for r in rows}


# --- grade tables -----------------------------------------------------------------------------


def assignment_table(session: Session, assignment: Assignment) -> list[dict[str, Any]]:
    """One row per student on the roster or with work: best, last, grade, passback state."""
    roster = people.members(session, assignment.course_id, role=STUDENT)
    work = summaries(session, assignment)
    sent = latest_passbacks(session, assignment.id)
    rows = []
    names = {m.user_id: m for m in roster}
    for uid in sorted(
        set(names) | set(work), key=lambda u: (names[u].name if u in names else work[u].name, u)
    ):
        s = work.get(uid) or Summary(uid, names[uid].name)
        m = names.get(uid)
        best, last = s.best, s.last
        pb = sent.get(uid)
        rows.append(
            {
                "user_id": uid,
                "student": m.name if m else s.name,
                "email": m.email if m else None,
                "roster_status": m.status if m else None,
                "submitted": bool(s.graded),
                "graded": len(s.graded),
                "in_progress": s.in_progress,
                "best_score": best.points if best else None,
                "best_id": best.id if best else None,
                "last_score": last.points if last else None,
                "last_id": last.id if last else None,
                "last_at": last.at if last else None,
                "grade": s.grade(assignment.policy),
                "score_maximum": assignment.score_maximum,
                "passback_status": pb.status if pb else None,
                "passback_progress": pb.grading_progress if pb else None,
                "passback_error": pb.error if pb else None,
                "passback_at": (pb.sent_at or pb.updated_at) if pb else None,
            }
        )
    return rows


def submitted_attempts(
    session: Session, course_id: int, quiz_id: str, *, lock: bool = False
) -> Sequence[Attempt]:
    stmt = (
        select(Attempt)
        .where(
            Attempt.course_id == course_id,
            Attempt.quiz_id == quiz_id,
            Attempt.status == SUBMITTED,
        )
        .order_by(Attempt.submitted_at, Attempt.id)
    )
    if lock:
        stmt = stmt.with_for_update()
    return session.execute(stmt).scalars().all()


def quiz_grades(session: Session, course_id: int, quiz: Quiz) -> dict[str, Any]:
    """The course's grades for a quiz, one row per student, by the quiz's scoring policy."""
    rows: dict[int, dict[str, Any]] = {}
    all_attempts = session.execute(
        select(
            Attempt.user_id,
            Attempt.student,
            Attempt.status,
            Attempt.id,
            Attempt.score,
            Attempt.submitted_at,
        )
        .where(Attempt.quiz_id == quiz.id, Attempt.course_id == course_id)
        .order_by(Attempt.student, Attempt.submitted_at, Attempt.id)
    ).all()
    for user_id, student, status, attempt_id, score, submitted_at in all_attempts:
        row = rows.setdefault(
            user_id,
            {
                "student": student,
                "attempts": 0,
                "in_progress": 0,
                "best_score": None,
                "best_attempt_id": None,
                "last_score": None,
                "last_attempt_id": None,
                "last_submitted_at": None,
                "grade": None,
                "max_score": quiz.points_possible,
            },
        )
        if status != SUBMITTED:
            row["in_progress"] += 1
            continue
        row["attempts"] += 1
        # Rows come in submission order: the first best score wins ties, the last row is last.
        if row["best_score"] is None or score > row["best_score"]:
            row["best_score"], row["best_attempt_id"] = score, attempt_id
        last: datetime | None = row["last_submitted_at"]
        if last is None or submitted_at >= last:
            row["last_score"], row["last_attempt_id"] = score, attempt_id
            row["last_submitted_at"] = submitted_at
    policy = quiz.settings.scoring_policy
    for row in rows.values():
        row["grade"] = row["last_score"] if policy == "keep_latest" else row["best_score"]
    return {
        "quiz_id": quiz.id,
        "quiz_revision": quiz.revision,
        "scoring_policy": policy,
        "max_score": quiz.points_possible,
        "students": sorted(rows.values(), key=lambda r: r["student"]),
    }


def regrade(session: Session, course_id: int, quiz: Quiz, *, dry_run: bool) -> dict[str, Any]:
    """Re-score the course's submitted attempts of ``quiz`` against its current key; report each
    attempt whose score or item points changed, and send changed assignment grades to the LMS."""
    from service.core.attempts import apply_grading

    attempts = submitted_attempts(session, course_id, quiz.id, lock=not dry_run)
    changes = []
    touched: set[tuple[str, int]] = set()
    for attempt in attempts:
        old_items = {r.item_id: (r.points, r.item_revision) for r in attempt.responses}
        old_score, old_max = attempt.score, attempt.max_score
        if dry_run:
            result = grading.score_attempt(quiz, {r.item_id: r.answer for r in attempt.responses})
        else:
            result = apply_grading(attempt, quiz)
        items = grading.diff_item_points(old_items, result.items)
        current = {it.id for it in quiz.items}
        # Answers to items removed from the quiz no longer count.
        items += [
            grading.ItemChange(i, pts, 0.0, rev, None)  # type: ignore[arg-type]
            for i, (pts, rev) in old_items.items()
            if i not in current and pts
        ]
        if items or old_score != result.score or old_max != result.max_score:
            changes.append(
                {
                    "attempt_id": attempt.id,
                    "student": attempt.student,
                    "number": attempt.number,
                    "old_score": old_score,
                    "new_score": result.score,
                    "old_max_score": old_max,
                    "new_max_score": result.max_score,
                    "items": [vars(c) for c in items],
                }
            )
            if attempt.assignment_id is not None:
                touched.add((attempt.assignment_id, attempt.user_id))
    session.flush()
    if not dry_run and touched:
        batch = uuid.uuid4().hex[:12]
        for assignment_id, user_id in sorted(touched):
            grade_event(session, assignment_id, user_id, f"regrade:{batch}:{user_id}")
    return {
        "quiz_id": quiz.id,
        "quiz_revision": quiz.revision,
        "dry_run": dry_run,
        "attempts_checked": len(attempts),
        "attempts_changed": len(changes),
        "changes": changes,
    }


# --- CSV ----------------------------------------------------------------------------------------


def csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    # A name starting with = + - @ would run as a formula when the CSV is opened in a
    # spreadsheet; the quote mark makes it inert.
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def to_csv(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([csv_cell(row.get(c)) for c in columns])
    return buf.getvalue()
