"""Assignments: a quiz or kernel exercise placed in a course with its delivery and grading rules.

Made by an instructor (deep linking from the LMS, or the stand-alone page); students reach them
through the LMS link or their course page. Attempts and submissions made for an assignment
carry its id, and its grade goes to the assignment's LMS column.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service import quizzes_store
from service.auth import Principal
from service.core.errors import ServiceError, invalid, not_found
from service.db.base import utcnow
from service.db.courses import BEST, EXERCISE, KINDS, LANG_MODES, POLICIES, QUIZ, Assignment
from workers.exercises import ExerciseError, list_exercises, load_exercise

_ASSIGNMENT_ID = re.compile(r"^[0-9a-f]{32}$")
#: Points of an exercise's grade column (its score is 0..1 of this).
EXERCISE_POINTS = 100.0


@dataclass(frozen=True)
class Resource:
    """Something an assignment can deliver: a quiz or a kernel exercise of the catalogue."""

    kind: str
    id: str
    title: str
    points: float
    allowed_attempts: int | None
    policy: str
    description: str = ""

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.id}"


def catalogue(session: Session) -> list[Resource]:
    """Every quiz and exercise an instructor can place, quizzes first."""
    out = []
    for q in quizzes_store.list_quizzes(session):
        s = q.settings
        out.append(
            Resource(
                QUIZ,
                q.id,
                q.title.en,
                q.points_possible,
                s.allowed_attempts,
                BEST if s.scoring_policy != "keep_latest" else "last",
                q.description.en,
            )
        )
    for ex_id in list_exercises():
        ex = load_exercise(ex_id)
        out.append(Resource(EXERCISE, ex.id, ex.title, EXERCISE_POINTS, None, BEST, ex.signature))
    return out


def resource(session: Session, kind: str, resource_id: str) -> Resource:
    """The quiz or exercise ``resource_id``; 422 naming the field when there is none."""
    if kind not in KINDS:
        raise invalid("form", "kind", f"must be one of {', '.join(KINDS)}")
    if kind == QUIZ:
        try:
            q = quizzes_store.get_quiz(session, resource_id)
        except quizzes_store.QuizNotFound:
            raise invalid("form", "resource", f"unknown quiz {resource_id!r}") from None
        s = q.settings
        policy = BEST if s.scoring_policy != "keep_latest" else "last"
        return Resource(QUIZ, q.id, q.title.en, q.points_possible, s.allowed_attempts, policy)
    try:
        ex = load_exercise(resource_id)
    except ExerciseError:
        raise invalid("form", "resource", f"unknown exercise {resource_id!r}") from None
    return Resource(EXERCISE, ex.id, ex.title, EXERCISE_POINTS, None, BEST, ex.signature)


@dataclass
class AssignmentSpec:
    """What an instructor chose: validated by ``parse_spec`` before anything is stored."""

    kind: str
    resource_id: str
    title: str
    lang: str
    allowed_attempts: int | None
    policy: str
    due_at: datetime | None


def parse_spec(session: Session, form: dict[str, Any]) -> AssignmentSpec:
    """Validate the picker's fields: ``resource`` ("quiz:ID" or "exercise:ID"), ``title``,
    ``lang``, ``attempts`` (blank: unlimited), ``policy``, ``due_at`` (ISO 8601, optional)."""
    kind, _, rid = str(form.get("resource") or "").partition(":")
    if not rid:
        raise invalid("form", "resource", "choose a quiz or an exercise")
    if kind not in KINDS:
        raise invalid("form", "resource", f"{kind!r} is neither a quiz nor an exercise")
    res = resource(session, kind, rid)
    title = str(form.get("title") or "").strip() or res.title
    if len(title) > 255:
        raise invalid("form", "title", "at most 255 characters")
    lang = str(form.get("lang") or "en")
    if lang not in LANG_MODES:
        raise invalid("form", "lang", f"must be one of {', '.join(LANG_MODES)}")
    raw_attempts = str(form.get("attempts") or "").strip()
    attempts: int | None = None
    if raw_attempts:
        try:
            attempts = int(raw_attempts)
        except ValueError:
            raise invalid("form", "attempts", "a whole number, or blank for unlimited") from None
        if not 1 <= attempts <= 100:
            raise invalid("form", "attempts", "between 1 and 100, or blank for unlimited")
    policy = str(form.get("policy") or BEST)
    if policy not in POLICIES:
        raise invalid("form", "policy", f"must be one of {', '.join(POLICIES)}")
    return AssignmentSpec(
        kind=res.kind,
        resource_id=res.id,
        title=title,
        lang=lang,
        allowed_attempts=attempts,
        policy=policy,
        due_at=parse_due(form.get("due_at")),
    )


def parse_due(raw: Any) -> datetime | None:
    """An ISO 8601 date-time (a datetime-local field's value counts as UTC); blank is none."""
    text = str(raw or "").strip()
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise invalid("form", "due_at", "a date and time like 2026-12-24T23:59") from None
    if value.tzinfo is None:
        from datetime import UTC

        value = value.replace(tzinfo=UTC)
    return value


def create(
    session: Session, course_id: int, spec: AssignmentSpec, created_by: int | None
) -> Assignment:
    res = resource(session, spec.kind, spec.resource_id)
    a = Assignment(
        id=uuid.uuid4().hex,
        course_id=course_id,
        kind=spec.kind,
        resource_id=spec.resource_id,
        title=spec.title,
        lang=spec.lang,
        allowed_attempts=spec.allowed_attempts,
        policy=spec.policy,
        due_at=spec.due_at,
        score_maximum=res.points,
        created_by=created_by,
        created_at=utcnow(),
    )
    session.add(a)
    session.flush()
    return a


def copy_to(session: Session, original: Assignment, course_id: int) -> Assignment:
    """The same assignment in another course (the LMS copied a course with our link)."""
    spec = AssignmentSpec(
        kind=original.kind,
        resource_id=original.resource_id,
        title=original.title,
        lang=original.lang,
        allowed_attempts=original.allowed_attempts,
        policy=original.policy,
        due_at=original.due_at,
    )
    copy = create(session, course_id, spec, None)
    copy.copied_from = original.id
    return copy


def find(session: Session, assignment_id: str) -> Assignment | None:
    if not _ASSIGNMENT_ID.match(assignment_id or ""):
        return None
    return session.get(Assignment, assignment_id)


def get(
    session: Session,
    actor: Principal,
    assignment_id: str,
    *,
    field: str = "assignment_id",
    location: str = "path",
) -> Assignment:
    """The assignment if it is in the actor's course, else a 404 (another course's
    assignments do not exist for them)."""
    a = find(session, assignment_id)
    if a is None or a.course_id != actor.course_id:
        raise not_found(field, f"unknown assignment {assignment_id!r}", location=location)
    return a


def for_target(
    session: Session,
    actor: Principal,
    assignment_id: str | None,
    kind: str,
    resource_id: str,
    location: str,
) -> Assignment | None:
    """The assignment a request names (``assignment_id``) for this quiz or exercise, or None
    when it names none; 404 for another course's, 422 for one that delivers something else."""
    if not assignment_id:
        return None
    a = get(session, actor, assignment_id, field="assignment_id", location=location)
    if a.kind != kind or a.resource_id != resource_id:
        raise invalid(location, "assignment_id", f"that assignment is not {kind} {resource_id!r}")
    return a


def for_course(session: Session, course_id: int) -> list[Assignment]:
    return list(
        session.execute(
            select(Assignment)
            .where(Assignment.course_id == course_id)
            .order_by(Assignment.created_at, Assignment.id)
        ).scalars()
    )


def check_open(assignment: Assignment | None, actor: Principal, what: str) -> None:
    """Refuse a student's new attempt or submission after the assignment's due date."""
    if assignment is None or actor.is_instructor or assignment.due_at is None:
        return
    if utcnow() > assignment.due_at:
        raise ServiceError(
            409, f"the due date passed at {assignment.due_at.isoformat()}: no new {what}"
        )
