"""Assignments of the caller's course over HTTP: what is placed there, each student's grade
(with the roster and whether the LMS has the grade), and re-sending grades to the LMS. A thin
adapter over ``service.core.assignments`` and ``service.core.grades``."""

from __future__ import annotations

from typing import Any

from flask.views import MethodView
from marshmallow import Schema, fields

from service.api.common import Blueprint, endpoint
from service.auth import current_principal
from service.core import assignments, grades
from service.extensions import db

blp = Blueprint(
    "assignments",
    __name__,
    url_prefix="/api/v1",
    description="Assignments of your course (quizzes and kernel exercises placed there, from an "
    "LMS or the course page), their grades, and grades sent again to the LMS.",
)


class AssignmentSchema(Schema):
    id = fields.String(required=True)
    kind = fields.String(required=True, metadata={"enum": ["quiz", "exercise"]})
    resource_id = fields.String(required=True, metadata={"description": "quiz or exercise id"})
    title = fields.String(required=True)
    lang = fields.String(required=True)
    allowed_attempts = fields.Integer(allow_none=True, metadata={"description": "null: no limit"})
    policy = fields.String(required=True, metadata={"enum": ["best", "last"]})
    due_at = fields.DateTime(allow_none=True)
    score_maximum = fields.Float(required=True)
    lti_linked = fields.Boolean(required=True, metadata={"description": "an LMS link launches it"})
    lineitem_url = fields.String(allow_none=True, metadata={"description": "its LMS grade column"})
    my_grade = fields.Float(
        allow_none=True, metadata={"description": "students: your grade by the policy"}
    )


class AssignmentGradeRowSchema(Schema):
    user_id = fields.Integer(required=True)
    student = fields.String(required=True)
    email = fields.String(allow_none=True)
    roster_status = fields.String(
        allow_none=True, metadata={"description": "active, inactive, deleted; null: not on it"}
    )
    submitted = fields.Boolean(required=True)
    graded = fields.Integer(required=True)
    in_progress = fields.Integer(required=True)
    best_score = fields.Float(allow_none=True)
    last_score = fields.Float(allow_none=True)
    last_at = fields.DateTime(allow_none=True)
    grade = fields.Float(allow_none=True)
    score_maximum = fields.Float(required=True)
    passback_status = fields.String(
        allow_none=True, metadata={"description": "pending, sent, superseded, failed; null: none"}
    )
    passback_error = fields.String(allow_none=True, metadata={"description": "the LMS's reason"})


class AssignmentGradesSchema(Schema):
    assignment = fields.Nested(AssignmentSchema, required=True)
    students = fields.List(fields.Nested(AssignmentGradeRowSchema), required=True)


class ResendSchema(Schema):
    queued = fields.Integer(required=True, metadata={"description": "grades queued for the LMS"})


@blp.route("/assignments")
class Assignments(MethodView):
    @endpoint(blp, roles=("instructor", "student"))
    @blp.response(200, AssignmentSchema(many=True))
    def get(self) -> list[dict[str, Any]]:
        """List your course's assignments

        Students also get their own grade in each (by its policy, on its points).
        """
        actor = current_principal()
        out = []
        for a in assignments.for_course(db.session, actor.course_id):
            row = a.describe()
            if not actor.is_instructor:
                mine = grades.summaries(db.session, a, [actor.user_id]).get(actor.user_id)
                row["my_grade"] = mine.grade(a.policy) if mine else None
            out.append(row)
        return out


@blp.route("/assignments/<string:assignment_id>/grades")
class AssignmentGrades(MethodView):
    @endpoint(blp, roles=("instructor",), errors=(404,))
    @blp.response(200, AssignmentGradesSchema)
    def get(self, assignment_id: str) -> dict[str, Any]:
        """An assignment's grades

        One row per student on the roster or with work: submitted or not, best and last, the
        grade by the policy, and whether the LMS holds it (with its reason when it refused).
        """
        a = assignments.get(db.session, current_principal(), assignment_id)
        return {"assignment": a.describe(), "students": grades.assignment_table(db.session, a)}


@blp.route("/assignments/<string:assignment_id>/resend")
class AssignmentResend(MethodView):
    @endpoint(blp, roles=("instructor",), errors=(404, 422), write=True)
    @blp.response(200, ResendSchema)
    def post(self, assignment_id: str) -> dict[str, int]:
        """Send every student's grade to the LMS again

        One new score per graded student, posted by the lti worker (after fixing what the LMS
        refused, say). Nothing happens for an assignment no LMS grades.
        """
        a = assignments.get(db.session, current_principal(), assignment_id)
        return {"queued": grades.resend(db.session, a)}
