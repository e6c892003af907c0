"""Taking a quiz over HTTP: a thin adapter over ``service.core.attempts``."""

from __future__ import annotations

from typing import Any

from flask.views import MethodView
from marshmallow import Schema, fields, validate

from service.api.common import Blueprint, endpoint
from service.api.schemas import (
    LANG_CHOICES,
    LANG_DESCRIPTION,
    FeedbackSchema,
    ItemViewSchema,
)
from service.auth import current_principal, prefetched
from service.core import assignments, attempts
from service.db.attempts import IN_PROGRESS, SUBMITTED
from service.db.courses import QUIZ
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
    assignment_id = fields.String(
        load_default=None,
        validate=validate.Length(min=1, max=64),
        metadata={"description": "optional: the assignment of your course this attempt is for"},
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
    assignment_id = fields.String(allow_none=True, metadata={"description": "null: catalogue"})
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
        `allowed_attempts` are used up (in-progress attempts count). With `assignment_id`, the
        attempt is for that assignment of your course: its language, attempts allowed and due
        date apply, and its grade goes to the LMS.
        """
        session = db.session
        actor = current_principal()
        assignment = assignments.for_target(
            session, actor, args.get("assignment_id"), QUIZ, quiz_id, "json"
        )
        attempt, quiz = attempts.start(session, actor, quiz_id, args["lang"], assignment)
        view = attempts.attempt_view(
            attempt, quiz, allowed=attempts.attempt_limit(quiz, assignment)
        )
        return view, 201, {"Location": f"/api/v1/attempts/{attempt.id}"}


@blp.route("/attempts/<string:attempt_id>")
class AttemptById(MethodView):
    @endpoint(blp, roles=("student", "instructor"), errors=(404,))
    @blp.response(200, AttemptSchema)
    def get(self, attempt_id: str) -> dict[str, Any]:
        """Show an attempt

        Its items, and for each answered item the answer with its feedback. Students may read
        only their own attempts; instructors those of their course.
        """
        attempt = attempts.get(db.session, current_principal(), attempt_id)
        quiz = attempts.load_quiz(db.session, attempt.quiz_id)
        return attempts.attempt_view(
            attempt, quiz, allowed=attempts.allowed_for(db.session, attempt, quiz)
        )


@blp.route("/attempts/<string:attempt_id>/responses")
class AttemptResponses(MethodView):
    @endpoint(
        blp,
        roles=("student",),
        errors=(400, 404, 409, 413, 422),
        write=True,
        idempotent=True,
        lock_late=True,
        autocommit=True,
        joined=attempts.ANSWER_READ,
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
        done = attempts.answer(
            db.session,
            current_principal(),
            attempt_id,
            args["item_id"],
            args["answer"],
            read=prefetched(attempts.ANSWER_READ),
        )
        return done.view, 201 if done.created else 200


@blp.route("/attempts/<string:attempt_id>/submit")
class AttemptSubmit(MethodView):
    @endpoint(blp, roles=("student",), errors=(400, 404, 409), write=True, idempotent=True)
    @blp.response(200, SubmitResultSchema)
    def post(self, attempt_id: str) -> dict[str, Any]:
        """Submit an attempt

        Closes the attempt and scores every item of the quiz against the current key
        (unanswered items score 0; multiple-answer items get partial credit: right minus wrong
        choices over the number of correct options, floored at 0). A second submit is a 409;
        retry with the same `Idempotency-Key` to get the original result again. An attempt made
        for an assignment sends the assignment's grade to the LMS.
        """
        return attempts.submit_view(attempts.submit(db.session, current_principal(), attempt_id))
