"""Taking a quiz: start an attempt, answer items with immediate feedback, submit for a score."""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import datetime, timedelta
from typing import Any

from flask.views import MethodView
from marshmallow import Schema, fields, validate
from sqlalchemy import func, select, text

from item_bank.model import Quiz
from service import grading
from service.api.common import Blueprint, endpoint, error, field_error
from service.api.quizzes import load_quiz_or_404
from service.api.schemas import (
    LANG_CHOICES,
    LANG_DESCRIPTION,
    FeedbackSchema,
    ItemViewSchema,
)
from service.api.views import item_view, response_view
from service.auth import current_principal
from service.db import is_postgres
from service.db.attempts import IN_PROGRESS, SUBMITTED, Attempt, ResponseRecord
from service.db.base import utcnow
from service.extensions import db

blp = Blueprint(
    "attempts",
    __name__,
    url_prefix="/api/v1",
    description="Taking a quiz: students start attempts, answer items (with immediate feedback) "
    "and submit; instructors may read any attempt.",
)

MAX_ID = 64


class AttemptStartSchema(Schema):
    lang = fields.String(
        load_default="en",
        validate=validate.OneOf(LANG_CHOICES),
        metadata={"description": LANG_DESCRIPTION},
    )


class AnswerSchema(Schema):
    item_id = fields.String(
        required=True,
        validate=validate.Length(min=1, max=MAX_ID),
        metadata={"description": "an item id of this attempt's quiz", "example": "q1"},
    )
    answer = fields.List(
        fields.String(validate=validate.Length(min=1, max=MAX_ID)),
        required=True,
        validate=validate.Length(min=1, max=26),
        metadata={
            "description": "chosen option ids: exactly one for multiple_choice and true_false, "
            "one or more for multiple_answers",
            "example": ["b"],
        },
    )


class AttemptItemSchema(ItemViewSchema):
    response = fields.Nested(
        FeedbackSchema,
        allow_none=True,
        metadata={"description": "your answer and its feedback; null until answered"},
    )


class ItemResultSchema(Schema):
    item_id = fields.String(required=True)
    revision = fields.Integer(required=True, metadata={"description": "item revision graded"})
    answered = fields.Boolean(required=True)
    answer = fields.List(fields.String(), required=True)
    correct = fields.Boolean(required=True)
    points = fields.Float(required=True)
    max_points = fields.Float(required=True)


class AttemptSchema(Schema):
    id = fields.String(required=True)
    quiz_id = fields.String(required=True)
    quiz_revision = fields.Integer(required=True)
    student = fields.String(required=True)
    number = fields.Integer(required=True, metadata={"description": "1 for the first attempt"})
    allowed_attempts = fields.Integer(allow_none=True, metadata={"description": "null: no limit"})
    lang = fields.String(required=True)
    status = fields.String(required=True, metadata={"enum": [IN_PROGRESS, SUBMITTED]})
    started_at = fields.DateTime(required=True)
    deadline = fields.DateTime(allow_none=True, metadata={"description": "from the time limit"})
    submitted_at = fields.DateTime(allow_none=True)
    score = fields.Float(allow_none=True)
    max_score = fields.Float(allow_none=True)
    item_revisions = fields.Dict(
        keys=fields.String(), values=fields.Integer(), metadata={"description": "item -> revision"}
    )
    items = fields.List(fields.Nested(AttemptItemSchema), required=True)


class SubmitResultSchema(Schema):
    attempt_id = fields.String(required=True)
    quiz_id = fields.String(required=True)
    student = fields.String(required=True)
    number = fields.Integer(required=True)
    status = fields.String(required=True)
    submitted_at = fields.DateTime(required=True)
    score = fields.Float(required=True)
    max_score = fields.Float(required=True)
    items = fields.List(fields.Nested(ItemResultSchema), required=True)


def _lock_student(quiz_id: str, student: str) -> None:
    """Serialize attempt creation per (quiz, student) so the attempt limit holds under races.

    SQLite needs nothing: write requests already run under BEGIN IMMEDIATE.
    """
    session = db.session
    if is_postgres(session.get_bind()):
        digest = hashlib.sha256(f"attempt:{quiz_id}:{student}".encode()).digest()
        key = int.from_bytes(digest[:8], "big", signed=True)
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})


def _deadline(attempt: Attempt, quiz: Quiz) -> datetime | None:
    minutes = quiz.settings.time_limit_minutes
    return attempt.started_at + timedelta(minutes=minutes) if minutes else None


def attempt_view(attempt: Attempt, quiz: Quiz) -> dict[str, Any]:
    reanswer = quiz.settings.allow_reanswer and attempt.status == IN_PROGRESS
    by_item = {r.item_id: r for r in attempt.responses}
    seed = attempt.id if quiz.settings.shuffle_answers else None
    items = []
    for it in quiz.items:
        view = item_view(it, quiz, attempt.lang, with_key=False, shuffle_seed=seed)
        rec = by_item.get(it.id)
        view["response"] = (
            response_view(rec, it, quiz, attempt.lang, reanswer=reanswer) if rec else None
        )
        items.append(view)
    return {
        "id": attempt.id,
        "quiz_id": attempt.quiz_id,
        "quiz_revision": attempt.quiz_revision,
        "student": attempt.student,
        "number": attempt.number,
        "allowed_attempts": quiz.settings.allowed_attempts,
        "lang": attempt.lang,
        "status": attempt.status,
        "started_at": attempt.started_at,
        "deadline": _deadline(attempt, quiz),
        "submitted_at": attempt.submitted_at,
        "score": attempt.score,
        "max_score": attempt.max_score,
        "item_revisions": attempt.item_revisions,
        "items": items,
    }


_ATTEMPT_ID = re.compile(r"^[0-9a-f]{32}$")


def _attempt_for_student(attempt_id: str, *, lock: bool) -> Attempt:
    # Attempt ids are uuid4 hex; anything else cannot exist (and a NUL byte would make
    # PostgreSQL fail the query instead of finding nothing).
    attempt = (
        db.session.get(Attempt, attempt_id, with_for_update=lock)
        if _ATTEMPT_ID.match(attempt_id)
        else None
    )
    if attempt is None:
        field_error(404, "path", "attempt_id", f"unknown attempt {attempt_id!r}")
    assert attempt is not None
    principal = current_principal()
    if not principal.is_instructor and attempt.student != principal.name:
        error(403, "this attempt belongs to another student")
    return attempt


@blp.route("/quizzes/<string:quiz_id>/attempts")
class QuizAttempts(MethodView):
    @endpoint(
        blp, roles=("student",), errors=(400, 404, 409, 413, 422), write=True, idempotent=True
    )
    @blp.arguments(AttemptStartSchema, description="Optional; the default language is `en`.")
    @blp.response(201, AttemptSchema)
    def post(self, args: dict[str, Any], quiz_id: str) -> tuple[dict[str, Any], int, Any]:
        """Start an attempt

        Returns the attempt id and its items (prompts and options, no key). 409 once the quiz's
        `allowed_attempts` are used up (in-progress attempts count).
        """
        quiz = load_quiz_or_404(quiz_id)
        student = current_principal().name
        _lock_student(quiz_id, student)
        used = db.session.execute(
            select(func.count())
            .select_from(Attempt)
            .where(Attempt.quiz_id == quiz_id, Attempt.student == student)
        ).scalar_one()
        limit = quiz.settings.allowed_attempts
        if limit is not None and used >= limit:
            error(409, f"attempt limit reached: {used} of {limit} attempts used for {quiz_id!r}")
        attempt = Attempt(
            id=uuid.uuid4().hex,
            quiz_id=quiz_id,
            student=student,
            token_id=current_principal().token_id,
            number=used + 1,
            lang=args["lang"],
            status=IN_PROGRESS,
            quiz_revision=quiz.revision,
            item_revisions={it.id: it.revision for it in quiz.items},
            started_at=utcnow(),
        )
        db.session.add(attempt)
        db.session.flush()
        attempt.responses = []
        return attempt_view(attempt, quiz), 201, {"Location": f"/api/v1/attempts/{attempt.id}"}


@blp.route("/attempts/<string:attempt_id>")
class AttemptById(MethodView):
    @endpoint(blp, roles=("student", "instructor"), errors=(404,))
    @blp.response(200, AttemptSchema)
    def get(self, attempt_id: str) -> dict[str, Any]:
        """Show an attempt

        Its items, and for each answered item the answer with its feedback. Students may read
        only their own attempts.
        """
        attempt = _attempt_for_student(attempt_id, lock=False)
        return attempt_view(attempt, load_quiz_or_404(attempt.quiz_id))


@blp.route("/attempts/<string:attempt_id>/responses")
class AttemptResponses(MethodView):
    @endpoint(
        blp, roles=("student",), errors=(400, 404, 409, 413, 422), write=True, idempotent=True
    )
    @blp.arguments(AnswerSchema)
    @blp.response(201, FeedbackSchema, description="First answer to this item, with feedback")
    @blp.alt_response(
        200, schema=FeedbackSchema, description="Answer replaced (quiz allows re-answering)"
    )
    def post(self, args: dict[str, Any], attempt_id: str) -> tuple[dict[str, Any], int]:
        """Answer an item

        Records the answer and returns immediate feedback in the attempt's language: whether it
        is correct, the points, the correct option ids, the explanation and the feedback of each
        chosen option. Answering an item again is a 409 unless the quiz allows re-answering. 409
        too once the attempt is submitted or past its time limit.
        """
        attempt = _attempt_for_student(attempt_id, lock=True)
        if attempt.status != IN_PROGRESS:
            error(409, "this attempt is already submitted")
        quiz = load_quiz_or_404(attempt.quiz_id)
        deadline = _deadline(attempt, quiz)
        if deadline is not None and utcnow() > deadline:
            error(409, f"the time limit passed at {deadline.isoformat()}; submit the attempt")
        try:
            item = quiz.item(args["item_id"])
        except KeyError:
            field_error(
                422,
                "json",
                "item_id",
                f"no item {args['item_id']!r} in quiz {quiz.id!r}; items are "
                + ", ".join(it.id for it in quiz.items),
            )
            raise
        try:
            scored = grading.score_item(item, args["answer"])
        except grading.AnswerError as exc:
            field_error(422, "json", "answer", str(exc))
            raise
        existing = db.session.execute(
            select(ResponseRecord).where(
                ResponseRecord.attempt_id == attempt.id, ResponseRecord.item_id == item.id
            )
        ).scalar_one_or_none()
        now = utcnow()
        if existing is not None:
            if not quiz.settings.allow_reanswer:
                error(409, f"item {item.id!r} is already answered in this attempt")
            rec = existing
            rec.times_answered += 1
            status = 200
        else:
            rec = ResponseRecord(attempt_id=attempt.id, item_id=item.id, times_answered=1)
            db.session.add(rec)
            status = 201
        rec.item_revision = item.revision
        rec.answer = list(scored.answer)
        rec.correct = scored.correct
        rec.points = scored.points
        rec.max_points = scored.max_points
        rec.answered_at = now
        db.session.flush()
        out = response_view(rec, item, quiz, attempt.lang, reanswer=quiz.settings.allow_reanswer)
        return out, status


@blp.route("/attempts/<string:attempt_id>/submit")
class AttemptSubmit(MethodView):
    @endpoint(blp, roles=("student",), errors=(400, 404, 409), write=True, idempotent=True)
    @blp.response(200, SubmitResultSchema)
    def post(self, attempt_id: str) -> dict[str, Any]:
        """Submit an attempt

        Closes the attempt and scores every item of the quiz against the current key
        (unanswered items score 0; multiple-answer items get partial credit: right minus wrong
        choices over the number of correct options, floored at 0). A second submit is a 409;
        retry with the same `Idempotency-Key` to get the original result again.
        """
        attempt = _attempt_for_student(attempt_id, lock=True)
        if attempt.status == SUBMITTED:
            error(
                409,
                f"this attempt was already submitted at {attempt.submitted_at}; "
                f"GET /api/v1/attempts/{attempt.id} shows its result",
            )
        quiz = load_quiz_or_404(attempt.quiz_id)
        result = apply_grading(attempt, quiz)
        attempt.status = SUBMITTED
        attempt.submitted_at = utcnow()
        db.session.flush()
        return submit_view(attempt, result)


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


def submit_view(attempt: Attempt, result: grading.AttemptScore) -> dict[str, Any]:
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
