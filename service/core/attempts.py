"""Taking a quiz: start an attempt, answer items with immediate feedback, submit for a score.

Shared by the REST API and the pages. Attempts live in a course; a student reaches only their
own, an instructor every attempt of their course. An attempt made for an assignment follows its
rules (language, attempts allowed, due date) and its score goes to the assignment's grade.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session, joinedload
from sqlalchemy.orm.attributes import set_committed_value

from item_bank.model import Item, Quiz
from item_bank.schema import ID_RE
from service import grading, quizzes_store
from service.auth import JoinedRead, Prefetched, Principal
from service.core import assignments as assignments_
from service.core import grades
from service.core.errors import conflict, forbidden, invalid, not_found
from service.core.views import item_view, response_view
from service.db import advisory_lock, begin_writing, is_postgres
from service.db.attempts import IN_PROGRESS, SUBMITTED, Attempt, ResponseRecord
from service.db.base import utcnow
from service.db.courses import Assignment
from service.db.prepared import Prepared
from service.db.quizzes import QuizRecord

_ATTEMPT_ID = re.compile(r"^[0-9a-f]{32}$")
_ITEM_ID = re.compile(ID_RE)


def load_quiz(session: Session, quiz_id: str, *, field: str = "quiz_id") -> Quiz:
    try:
        return quizzes_store.get_quiz(session, quiz_id)
    except quizzes_store.QuizNotFound:
        raise not_found(field, f"unknown quiz {quiz_id!r}") from None


def attempt_limit(quiz: Quiz, assignment: Assignment | None) -> int | None:
    return assignment.allowed_attempts if assignment is not None else quiz.settings.allowed_attempts


def _same_target(quiz_id: str, actor: Principal, assignment: Assignment | None) -> list[Any]:
    where = [
        Attempt.quiz_id == quiz_id,
        Attempt.course_id == actor.course_id,
        Attempt.user_id == actor.user_id,
    ]
    where.append(
        Attempt.assignment_id == assignment.id
        if assignment is not None
        else Attempt.assignment_id.is_(None)
    )
    return where


def _count_used(for_assignment: bool) -> Prepared:
    a = Attempt.__table__.c
    same = (
        a.assignment_id == bindparam("assignment_id")
        if for_assignment
        else a.assignment_id.is_(None)
    )
    return Prepared(
        select(func.count())
        .select_from(Attempt.__table__)
        .where(
            a.quiz_id == bindparam("quiz_id"),
            a.course_id == bindparam("course_id"),
            a.user_id == bindparam("user_id"),
            same,
        )
    )


#: by whether the attempts are an assignment's (True) or the catalogue's: every start counts
_COUNT_USED = {True: _count_used(True), False: _count_used(False)}


def attempts_used(
    session: Session, actor: Principal, quiz_id: str, assignment: Assignment | None
) -> int:
    params: dict[str, Any] = {
        "quiz_id": quiz_id,
        "course_id": actor.course_id,
        "user_id": actor.user_id,
    }
    if assignment is not None:
        params["assignment_id"] = assignment.id
    return int(_COUNT_USED[assignment is not None].execute(session.connection(), params).scalar())


def my_attempts(
    session: Session, actor: Principal, quiz_id: str, assignment: Assignment | None
) -> list[Attempt]:
    return list(
        session.execute(
            select(Attempt)
            .where(*_same_target(quiz_id, actor, assignment))
            .order_by(Attempt.number)
        ).scalars()
    )


def start(
    session: Session,
    actor: Principal,
    quiz_id: str,
    lang: str,
    assignment: Assignment | None = None,
) -> tuple[Attempt, Quiz]:
    """A new attempt; 409 once the attempts allowed are used up (in-progress ones count)."""
    if actor.is_instructor:
        raise forbidden("instructors preview quizzes; attempts are for students")
    quiz = load_quiz(session, quiz_id)
    assignments_.check_open(assignment, actor, "attempts")
    key = (
        f"attempt:{actor.course_id}:{actor.user_id}:{quiz_id}:{assignment.id if assignment else ''}"
    )
    advisory_lock(session, key)
    used = attempts_used(session, actor, quiz_id, assignment)
    limit = attempt_limit(quiz, assignment)
    if limit is not None and used >= limit:
        raise conflict(f"attempt limit reached: {used} of {limit} attempts used for {quiz_id!r}")
    attempt = Attempt(
        id=uuid.uuid4().hex,
        quiz_id=quiz_id,
        course_id=actor.course_id,
        user_id=actor.user_id,
        student=actor.name,
        assignment_id=assignment.id if assignment is not None else None,
        token_id=actor.token_id,
        number=used + 1,
        lang=assignment.lang if assignment is not None else lang,
        status=IN_PROGRESS,
        quiz_revision=quiz.revision,
        item_revisions={it.id: it.revision for it in quiz.items},
        started_at=utcnow(),
    )
    # a Core insert (an ORM flush cost a sixth of a start's CPU): the object returned stays
    # out of the session, the row as stored, with no responses yet
    _INSERT_ATTEMPT.execute(session.connection(), {c: getattr(attempt, c) for c in _NEW_ATTEMPT})
    set_committed_value(attempt, "responses", [])
    return attempt, quiz


#: every column of a new attempt (none of those a submit fills in is left to a default)
_NEW_ATTEMPT = (
    "id",
    "quiz_id",
    "course_id",
    "user_id",
    "student",
    "assignment_id",
    "token_id",
    "number",
    "lang",
    "status",
    "quiz_revision",
    "item_revisions",
    "started_at",
)
_INSERT_ATTEMPT = Prepared(Attempt.__table__.insert(), column_keys=_NEW_ATTEMPT)


#: The attempt by id with its responses and its quiz row's version (built once: every view of
#: an attempt runs it). Only reads use it: a submit takes the attempt's lock with Core rows.
_ATTEMPT_QUERY = (
    select(Attempt, QuizRecord.revision, QuizRecord.updated_at)
    .join(QuizRecord, QuizRecord.id == Attempt.quiz_id)
    .where(Attempt.id == bindparam("attempt_id"))
    .options(joinedload(Attempt.responses))
)


def _load(session: Session, attempt_id: str) -> Attempt | None:
    """The attempt with its responses and its quiz row's version: every use of an attempt needs
    its quiz next (``load_quiz`` then answers from its cache without a query of its own)."""
    row = session.execute(_ATTEMPT_QUERY, {"attempt_id": attempt_id}).unique().first()
    if row is None:
        return None
    attempt, revision, updated_at = row
    quizzes_store.note_version(session, attempt.quiz_id, revision, updated_at)
    return attempt


def get(session: Session, actor: Principal, attempt_id: str) -> Attempt:
    """The attempt, if the actor may see it: their own, or any of their course as instructor.

    Another course's attempt is a 404 (it does not exist for them); another student's in the
    same course a 403.
    """
    # Attempt ids are uuid4 hex; anything else cannot exist (and a NUL byte would make
    # PostgreSQL fail the query instead of finding nothing).
    attempt = _load(session, attempt_id) if _ATTEMPT_ID.match(attempt_id) else None
    _check_visible(actor, attempt_id, attempt)
    assert attempt is not None
    return attempt


def _check_visible(actor: Principal, attempt_id: str, attempt: Any) -> None:
    """404 for no attempt or another course's (it does not exist for them), 403 for another
    student's; ``attempt`` is a row or an ORM object with ``course_id`` and ``user_id``."""
    if attempt is None or attempt.course_id != actor.course_id:
        raise not_found("attempt_id", f"unknown attempt {attempt_id!r}")
    if not actor.is_instructor and attempt.user_id != actor.user_id:
        raise forbidden("this attempt belongs to another student")


def due_at(started_at: datetime, quiz: Quiz) -> datetime | None:
    minutes = quiz.settings.time_limit_minutes
    return started_at + timedelta(minutes=minutes) if minutes else None


def deadline(attempt: Attempt, quiz: Quiz) -> datetime | None:
    return due_at(attempt.started_at, quiz)


@dataclass
class Answered:
    created: bool
    view: dict[str, Any]


@dataclass(frozen=True)
class _Target:
    """What an answer needs of its attempt, and the item's stored answer if any."""

    id: str
    quiz_id: str
    course_id: int
    user_id: int
    status: str
    lang: str
    started_at: datetime
    response_id: int | None
    times_answered: int | None
    #: False: read without the item's stored answer (``ANSWER_READ``), whose write finds it
    response_known: bool = True


_A, _R, _Q = Attempt.__table__.c, ResponseRecord.__table__.c, QuizRecord.__table__.c
_WITH_ITEM_RESPONSE = Attempt.__table__.outerjoin(
    ResponseRecord.__table__, (_R.attempt_id == _A.id) & (_R.item_id == bindparam("item_id"))
)
#: An answer's target, read by position (``_visible_target``): these attempt columns, then
#: its quiz row's revision and updated_at, then (``_ANSWER_TARGET`` only) the item's answer.
_ATTEMPT_COLS = ("id", "quiz_id", "course_id", "user_id", "status", "lang", "started_at")
_ATTEMPT_AND_VERSION = (*(_A[c] for c in _ATTEMPT_COLS), _Q.revision, _Q.updated_at)
#: The attempt, its quiz row's version and one item's stored answer: one row, no ORM objects
#: (an answer is most of a quiz's requests; loading the attempt and all its responses as ORM
#: objects cost more than the rest of the request's database work).
_ANSWER_TARGET = (
    select(*_ATTEMPT_AND_VERSION, _R.id.label("response_id"), _R.times_answered)
    .select_from(_WITH_ITEM_RESPONSE.join(QuizRecord.__table__, _Q.id == _A.quiz_id))
    .where(_A.id == bindparam("attempt_id"))
)
_READ_ANSWER_TARGET = Prepared(_ANSWER_TARGET)


def _answer_read_params(view_args: Mapping[str, Any]) -> dict[str, Any] | None:
    attempt_id = view_args.get("attempt_id", "")
    return {"attempt_id": attempt_id} if _ATTEMPT_ID.match(attempt_id) else None


#: An answer's attempt read in its token lookup's statement (``endpoint(joined=...)``): the
#: attempt and its quiz row's version, without the item's stored answer (the body is parsed
#: only after the token is checked). An item answered before then shows at the write, which
#: inserts nothing, and the answer reads again with the item (``answer``).
ANSWER_READ = JoinedRead(
    select(*_ATTEMPT_AND_VERSION)
    .select_from(Attempt.__table__.join(QuizRecord.__table__, _Q.id == _A.quiz_id))
    .where(_A.id == bindparam("attempt_id")),
    _answer_read_params,
)


#: The columns an answer's check fills (``_check_answer``'s values).
_SCORED = ("item_revision", "answer", "correct", "points", "max_points", "answered_at")


#: The attempt's row, only while it is in progress, under a share lock (PostgreSQL; SQLite
#: has no row locks, and its writer lock is held by then). A write joined to it applies only
#: if the attempt is still in progress when the write runs: a submit holds the row's update
#: lock until it commits, so the write waits for it and then, as READ COMMITTED rereads a row
#: it waited for, finds the attempt submitted and writes nothing; a submit that comes later
#: waits for the write and then reads its answer. Without this guard the attempt had to be
#: locked by the first read, in a transaction: a BEGIN and a COMMIT more per answer.
_IN_PROGRESS = (
    select(_A.id)
    .where(_A.id == bindparam("attempt_id"), _A.status == IN_PROGRESS)
    .with_for_update(read=True, of=Attempt.__table__)
)


def _insert_new(dialect: str) -> Any:
    """A first answer that yields its id, or nothing when the item has one already (a
    concurrent request's: the unique constraint is the judge, read at the latest commit) or
    the attempt is no longer in progress (``_IN_PROGRESS``)."""
    from sqlalchemy.dialects import postgresql, sqlite

    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    cols = ("item_id", "times_answered", *_SCORED)
    row = _IN_PROGRESS.add_columns(*(bindparam(c, type_=_R[c].type) for c in cols))
    stmt = insert(ResponseRecord.__table__).from_select(("attempt_id", *cols), row)
    stmt = stmt.on_conflict_do_nothing(index_elements=["attempt_id", "item_id"])
    return Prepared(stmt.returning(_R.id))


_INSERT_NEW = {d: _insert_new(d) for d in ("postgresql", "sqlite")}
#: A repeated answer replaces the stored one only if no other request replaced it meanwhile,
#: and only while the attempt is in progress (``_IN_PROGRESS``).
_REPLACE = Prepared(
    ResponseRecord.__table__.update()
    .where(
        _R.id == bindparam("response_id"),
        _R.times_answered == bindparam("times_before"),
        _R.attempt_id.in_(_IN_PROGRESS),
    )
    .values(times_answered=_R.times_answered + 1, **{c: bindparam(f"new_{c}") for c in _SCORED})
)
#: Tries of an answer whose write found its read overtaken (see ``answer``).
_ANSWER_TRIES = 3


def answer(
    session: Session,
    actor: Principal,
    attempt_id: str,
    item_id: str,
    chosen: list[str],
    read: Prefetched | None = None,
) -> Answered:
    """Record an answer and return its immediate feedback (in the attempt's language).

    The attempt and the item's stored answer are read without a lock and the answer is checked
    and scored; then the write (``_store``) applies only to what was read: the item's answer
    as it was, the attempt still in progress (``_IN_PROGRESS``). If a concurrent request came
    first (another answer to the item, a submit), the write does nothing and the answer is
    read and checked again, which refuses it or writes it over the newer answer.

    SQLite: the database's one writer lock is taken (``begin_writing``) only after the
    checks, and no other write can come between the next read and the write, so a second
    try always settles it. PostgreSQL needs no lock before the write, so the request may run
    without a transaction (``endpoint(autocommit=True)``): each statement commits itself.

    ``read``: the attempt as ``ANSWER_READ`` found it with the token; its first write then
    stands for the item's read, and does not count as a try.
    """
    # an id no item can have (a NUL byte, say) looks up none: the check below names it
    params = {"attempt_id": attempt_id, "item_id": item_id if _ITEM_ID.match(item_id) else ""}
    if read is not None:
        target = _visible_target(session, actor, attempt_id, read.row)
    else:
        target = _answer_target(session, actor, params)
    quiz, item, values = _check_answer(session, actor, target, item_id, chosen)
    begin_writing(session)
    for _ in range(_ANSWER_TRIES + (not target.response_known)):
        stored = _store(session, target, item.id, values)
        if stored is not None:
            break
        target = _answer_target(session, actor, params)
        quiz, item, values = _check_answer(session, actor, target, item_id, chosen)
    else:
        raise conflict(f"other requests kept answering {item.id!r} meanwhile; try again")
    rec = _Stored(attempt_id=target.id, item_id=item.id, times_answered=stored[1], **values)
    view = response_view(rec, item, quiz, target.lang, reanswer=quiz.settings.allow_reanswer)
    return Answered(target.response_id is None, view)


@dataclass(frozen=True)
class _Stored:
    """The answer as ``_store`` wrote it, for its view (a ``views.StoredAnswer``)."""

    attempt_id: str
    item_id: str
    item_revision: int
    answer: list[str]
    correct: bool
    points: float
    max_points: float
    times_answered: int
    answered_at: datetime


def _store(
    session: Session, target: _Target, item_id: str, values: dict[str, Any]
) -> tuple[int, int] | None:
    """Insert or replace the item's answer as ``target`` read it: (its id, times answered), or
    None if the stored answer is no longer the one read (a concurrent request's came first)."""
    conn = session.connection()
    if target.response_id is None:
        row = {"attempt_id": target.id, "item_id": item_id, "times_answered": 1, **values}
        new_id = _INSERT_NEW[conn.dialect.name].execute(conn, row).scalar()
        return None if new_id is None else (int(new_id), 1)
    before = target.times_answered or 0
    params = {f"new_{c}": values[c] for c in _SCORED}
    params.update(response_id=target.response_id, times_before=before, attempt_id=target.id)
    if _REPLACE.execute(conn, params).rowcount != 1:
        return None
    return target.response_id, before + 1


def _answer_target(session: Session, actor: Principal, params: dict[str, str]) -> _Target:
    attempt_id = params["attempt_id"]
    row = None
    if _ATTEMPT_ID.match(attempt_id):
        row = _READ_ANSWER_TARGET.execute(session.connection(), params).first()
    return _visible_target(session, actor, attempt_id, row)


def _visible_target(
    session: Session, actor: Principal, attempt_id: str, row: Sequence[Any] | None
) -> _Target:
    """The target of a row of ``_ANSWER_TARGET`` or ``ANSWER_READ`` (without the item's
    answer: ``response_known`` False), if the actor may answer in it (``_check_visible``)."""
    n = len(_ATTEMPT_COLS)
    target = None
    if row is not None:
        known = len(row) > n + 2
        response = tuple(row[n + 2 :]) if known else (None, None)
        target = _Target(*row[:n], *response, response_known=known)
    _check_visible(actor, attempt_id, target)
    assert target is not None and row is not None
    quizzes_store.note_version(session, target.quiz_id, row[n], row[n + 1])
    return target


def _check_answer(
    session: Session, actor: Principal, target: _Target, item_id: str, chosen: list[str]
) -> tuple[Quiz, Item, dict[str, Any]]:
    """Everything ``answer`` decides before writing: refusals, the score, the values to store."""
    if actor.is_instructor or target.user_id != actor.user_id:
        raise forbidden("only the student taking an attempt answers it")
    if target.status != IN_PROGRESS:
        raise conflict("this attempt is already submitted")
    quiz = load_quiz(session, target.quiz_id)
    due = due_at(target.started_at, quiz)
    if due is not None and utcnow() > due:
        raise conflict(f"the time limit passed at {due.isoformat()}; submit the attempt")
    try:
        item = quiz.item(item_id)
    except KeyError:
        raise invalid(
            "json",
            "item_id",
            f"no item {item_id!r} in quiz {quiz.id!r}; items are "
            + ", ".join(it.id for it in quiz.items),
        ) from None
    try:
        scored = grading.score_item(item, chosen)
    except grading.AnswerError as exc:
        raise invalid("json", "answer", str(exc)) from None
    if target.response_id is not None and not quiz.settings.allow_reanswer:
        raise conflict(f"item {item.id!r} is already answered in this attempt")
    values = {
        "item_revision": item.revision,
        "answer": list(scored.answer),
        "correct": scored.correct,
        "points": scored.points,
        "max_points": scored.max_points,
        "answered_at": utcnow(),
    }
    return quiz, item, values


@dataclass(frozen=True)
class Submitted:
    """An attempt as ``submit`` closed it, with its score (for ``submit_view``)."""

    id: str
    quiz_id: str
    student: str
    number: int
    status: str
    submitted_at: datetime
    result: grading.AttemptScore


_SUBMIT_TARGET = (
    select(
        _A.id,
        _A.quiz_id,
        _A.course_id,
        _A.user_id,
        _A.student,
        _A.number,
        _A.assignment_id,
        _A.status,
        _A.submitted_at,
        _Q.revision,
        _Q.updated_at,
    )
    .select_from(Attempt.__table__.join(QuizRecord.__table__, _Q.id == _A.quiz_id))
    .where(_A.id == bindparam("attempt_id"))
)
#: by whether the backend locks the attempt's row (PostgreSQL; SQLite's writer already holds
#: the database's write lock): a concurrent answer or submit of it waits until this commits
_SUBMIT_TARGETS = {
    False: Prepared(_SUBMIT_TARGET),
    True: Prepared(_SUBMIT_TARGET.with_for_update(of=Attempt.__table__)),
}
#: read once the attempt's lock is held, so the latest answers are the ones scored
_STORED_ANSWERS = Prepared(
    select(
        _R.id, _R.item_id, _R.answer, _R.points, _R.correct, _R.max_points, _R.item_revision
    ).where(_R.attempt_id == bindparam("attempt_id"))
)
_GRADED = ("points", "correct", "max_points", "item_revision")
_RESCORE = Prepared(
    ResponseRecord.__table__.update()
    .where(_R.id == bindparam("response_id"))
    .values(**{c: bindparam(f"new_{c}") for c in _GRADED})
)
_CLOSED = ("submitted_at", "score", "max_score", "item_revisions", "quiz_revision", "graded_at")
_CLOSE = Prepared(
    Attempt.__table__.update()
    .where(_A.id == bindparam("attempt_id"), _A.status == IN_PROGRESS)
    .values(status=SUBMITTED, **{c: bindparam(f"new_{c}") for c in _CLOSED})
)


def submit(session: Session, actor: Principal, attempt_id: str) -> Submitted:
    """Close the attempt and score it against its quiz's current key; its assignment's grade
    goes to the LMS.

    Core rows, not ORM objects (as ``answer``): loading the attempt with its answers and
    flushing their changes through the ORM cost half of a submit's CPU. The answers whose
    stored points differ from the new scoring (a key changed since) are updated, as a flush
    would have done.
    """
    conn = session.connection()
    row = None
    if _ATTEMPT_ID.match(attempt_id):
        target = _SUBMIT_TARGETS[is_postgres(conn)]
        row = target.execute(conn, {"attempt_id": attempt_id}).first()
    _check_visible(actor, attempt_id, row)
    assert row is not None
    if actor.is_instructor or row.user_id != actor.user_id:
        raise forbidden("only the student taking an attempt submits it")
    if row.status == SUBMITTED:
        raise conflict(
            f"this attempt was already submitted at {row.submitted_at}; "
            f"GET /api/v1/attempts/{row.id} shows its result"
        )
    quizzes_store.note_version(session, row.quiz_id, row.revision, row.updated_at)
    quiz = load_quiz(session, row.quiz_id)
    stored = _STORED_ANSWERS.execute(conn, {"attempt_id": row.id}).rows
    result = grading.score_attempt(quiz, {r.item_id: r.answer for r in stored})
    by_item = {s.item_id: s for s in result.items}
    for r in stored:
        s = by_item.get(r.item_id)
        if s is None:  # an item removed from the quiz since: its answer stays as it was
            continue
        new = {"new_points": s.points, "new_correct": s.correct}
        new |= {"new_max_points": s.max_points, "new_item_revision": s.revision}
        if (r.points, r.correct, r.max_points, r.item_revision) != tuple(new.values()):
            _RESCORE.execute(conn, {"response_id": r.id, **new})
    now = utcnow()
    closed = {
        "new_submitted_at": now,
        "new_score": result.score,
        "new_max_score": result.max_score,
        "new_item_revisions": result.revisions,
        "new_quiz_revision": quiz.revision,
        "new_graded_at": now,
    }
    if _CLOSE.execute(conn, {"attempt_id": row.id, **closed}).rowcount != 1:
        raise RuntimeError(f"attempt {row.id!r} changed under its lock")  # cannot: it is held
    if row.assignment_id is not None:
        grades.grade_event(session, row.assignment_id, row.user_id, f"attempt:{row.id}:submitted")
    return Submitted(row.id, row.quiz_id, row.student, row.number, SUBMITTED, now, result)


def apply_grading(attempt: Attempt, quiz: Quiz) -> grading.AttemptScore:
    """Score ``attempt`` against ``quiz``'s current key and store the result on its rows."""
    answers = {r.item_id: r.answer for r in attempt.responses}
    result = grading.score_attempt(quiz, answers)
    by_item = {s.item_id: s for s in result.items}
    for rec in attempt.responses:
        s = by_item.get(rec.item_id)
        if s is not None:
            rec.points = s.points
            rec.correct = s.correct
            rec.max_points = s.max_points
            rec.item_revision = s.revision
    attempt.score = result.score
    attempt.max_score = result.max_score
    attempt.item_revisions = result.revisions
    attempt.quiz_revision = quiz.revision
    attempt.graded_at = utcnow()
    return result


def attempt_view(
    attempt: Attempt, quiz: Quiz, lang: str | None = None, allowed: int | None = None
) -> dict[str, Any]:
    """The attempt with its items in the attempt's option order; answered items carry their
    feedback, unanswered ones nothing of the key. ``lang`` overrides the attempt's language
    (the pages' language switch)."""
    lang = lang or attempt.lang
    reanswer = quiz.settings.allow_reanswer and attempt.status == IN_PROGRESS
    by_item = {r.item_id: r for r in attempt.responses}
    seed = attempt.id if quiz.settings.shuffle_answers else None
    items = []
    for it in quiz.items:
        view = item_view(it, quiz, lang, with_key=False, shuffle_seed=seed)
        rec = by_item.get(it.id)
        view["response"] = response_view(rec, it, quiz, lang, reanswer=reanswer) if rec else None
        items.append(view)
    return {
        "id": attempt.id,
        "quiz_id": attempt.quiz_id,
        "quiz_revision": attempt.quiz_revision,
        "student": attempt.student,
        "number": attempt.number,
        "allowed_attempts": allowed if allowed is not None else quiz.settings.allowed_attempts,
        "assignment_id": attempt.assignment_id,
        "lang": attempt.lang,
        "status": attempt.status,
        "started_at": attempt.started_at,
        "deadline": deadline(attempt, quiz),
        "submitted_at": attempt.submitted_at,
        "score": attempt.score,
        "max_score": attempt.max_score,
        "item_revisions": attempt.item_revisions,
        "items": items,
    }


def submit_view(attempt: Submitted) -> dict[str, Any]:
    result = attempt.result
    return {
        "attempt_id": attempt.id,
        "quiz_id": attempt.quiz_id,
        "student": attempt.student,
        "number": attempt.number,
        "status": attempt.status,
        "submitted_at": attempt.submitted_at,
        "score": result.score,
        "max_score": result.max_score,
        "items": [
            {
                "item_id": s.item_id,
                "revision": s.revision,
                "answered": s.answered,
                "answer": list(s.answer),
                "correct": s.correct,
                "points": s.points,
                "max_points": s.max_points,
            }
            for s in result.items
        ],
    }


def allowed_for(session: Session, attempt: Attempt, quiz: Quiz) -> int | None:
    a = session.get(Assignment, attempt.assignment_id) if attempt.assignment_id else None
    return attempt_limit(quiz, a)
