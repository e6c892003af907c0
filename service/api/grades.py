"""Instructors: regrade submitted attempts against the current key, and pull grades (their
course's), over ``service.core.grades``."""

from __future__ import annotations

from typing import Any

from flask import Response
from flask.views import MethodView
from marshmallow import Schema, fields

from service import quizzes_store as store
from service.api.common import Blueprint, endpoint, field_error
from service.auth import current_principal
from service.core import attempts, grades
from service.extensions import db

blp = Blueprint(
    "grades",
    __name__,
    url_prefix="/api/v1",
    description="Instructors: regrade attempts after a key change, and pull grades (JSON, CSV).",
)


class RegradeArgsSchema(Schema):
    dry_run = fields.Boolean(
        load_default=False,
        metadata={"description": "report what would change without storing anything"},
    )


class ItemChangeSchema(Schema):
    item_id = fields.String(required=True)
    old_points = fields.Float(allow_none=True)
    new_points = fields.Float(required=True)
    old_revision = fields.Integer(allow_none=True)
    new_revision = fields.Integer(allow_none=True, metadata={"description": "null: item removed"})


class AttemptChangeSchema(Schema):
    attempt_id = fields.String(required=True)
    student = fields.String(required=True)
    number = fields.Integer(required=True)
    old_score = fields.Float(allow_none=True)
    new_score = fields.Float(required=True)
    old_max_score = fields.Float(allow_none=True)
    new_max_score = fields.Float(required=True)
    items = fields.List(fields.Nested(ItemChangeSchema), required=True)


class RegradeReportSchema(Schema):
    quiz_id = fields.String(required=True)
    quiz_revision = fields.Integer(required=True)
    dry_run = fields.Boolean(required=True)
    attempts_checked = fields.Integer(required=True)
    attempts_changed = fields.Integer(required=True)
    changes = fields.List(fields.Nested(AttemptChangeSchema), required=True)


class GradeRowSchema(Schema):
    student = fields.String(required=True)
    attempts = fields.Integer(required=True, metadata={"description": "submitted attempts"})
    in_progress = fields.Integer(required=True)
    best_score = fields.Float(allow_none=True)
    best_attempt_id = fields.String(allow_none=True)
    last_score = fields.Float(allow_none=True)
    last_attempt_id = fields.String(allow_none=True)
    last_submitted_at = fields.DateTime(allow_none=True)
    grade = fields.Float(
        allow_none=True, metadata={"description": "best or last, per the quiz's scoring_policy"}
    )
    max_score = fields.Float(required=True)


class GradesSchema(Schema):
    quiz_id = fields.String(required=True)
    quiz_revision = fields.Integer(required=True)
    scoring_policy = fields.String(required=True)
    max_score = fields.Float(required=True)
    students = fields.List(fields.Nested(GradeRowSchema), required=True)


CSV_COLUMNS = [
    "student",
    "attempts",
    "in_progress",
    "best_score",
    "best_attempt_id",
    "last_score",
    "last_attempt_id",
    "last_submitted_at",
    "grade",
    "max_score",
]


@blp.route("/quizzes/<string:quiz_id>/regrade")
class Regrade(MethodView):
    @endpoint(blp, roles=("instructor",), errors=(404, 413, 422), write=True)
    @blp.arguments(RegradeArgsSchema, description="Optional.")
    @blp.response(200, RegradeReportSchema)
    def post(self, args: dict[str, Any], quiz_id: str) -> dict[str, Any]:
        """Regrade a quiz

        Re-scores every submitted attempt against the quiz's current key (and item revisions)
        and reports each attempt whose score or item points changed: old and new score, and the
        items that changed with their old and new revisions.
        """
        try:
            quiz = store.get_quiz(db.session, quiz_id, for_update=True)
        except store.QuizNotFound:
            field_error(404, "path", "quiz_id", f"unknown quiz {quiz_id!r}")
            raise
        return grades.regrade(
            db.session, current_principal().course_id, quiz, dry_run=args["dry_run"]
        )


@blp.route("/quizzes/<string:quiz_id>/grades")
class Grades(MethodView):
    @endpoint(blp, roles=("instructor",), errors=(404,))
    @blp.response(200, GradesSchema)
    def get(self, quiz_id: str) -> dict[str, Any]:
        """Grades (JSON)

        One row per student: submitted attempts, best and last attempt with scores, and the
        grade by the quiz's scoring policy.
        """
        quiz = attempts.load_quiz(db.session, quiz_id)
        return grades.quiz_grades(db.session, current_principal().course_id, quiz)


@blp.route("/quizzes/<string:quiz_id>/grades.csv")
class GradesCsv(MethodView):
    @endpoint(blp, roles=("instructor",), errors=(404,))
    @blp.response(
        200,
        description="CSV with a header row: " + ", ".join(CSV_COLUMNS),
        content_type="text/csv",
    )
    def get(self, quiz_id: str) -> Response:
        """Grades (CSV)

        The same rows as the JSON grades, one per student, as a CSV download.
        """
        quiz = attempts.load_quiz(db.session, quiz_id)
        data = grades.quiz_grades(db.session, current_principal().course_id, quiz)
        return Response(
            grades.to_csv(CSV_COLUMNS, data["students"]),
            mimetype="text/csv",
            headers={"Content-Disposition": f'attachment; filename="{quiz_id}-grades.csv"'},
        )
