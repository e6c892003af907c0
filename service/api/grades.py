"""Instructors: regrade submitted attempts against the current key, and pull grades."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from flask import Response
from flask.views import MethodView
from marshmallow import Schema, fields
from sqlalchemy import select

from item_bank.model import Quiz
from service import grading
from service import quizzes_store as store
from service.api.attempts import apply_grading
from service.api.common import Blueprint, endpoint, field_error
from service.api.quizzes import load_quiz_or_404
from service.db.attempts import SUBMITTED, Attempt
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


def _submitted(quiz_id: str, *, lock: bool = False) -> Sequence[Attempt]:
    stmt = (
        select(Attempt)
        .where(Attempt.quiz_id == quiz_id, Attempt.status == SUBMITTED)
        .order_by(Attempt.submitted_at, Attempt.id)
    )
    if lock:
        stmt = stmt.with_for_update()
    return db.session.execute(stmt).scalars().all()


def regrade(quiz: Quiz, *, dry_run: bool) -> dict[str, Any]:
    attempts = _submitted(quiz.id, lock=not dry_run)
    changes = []
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
    db.session.flush()
    return {
        "quiz_id": quiz.id,
        "quiz_revision": quiz.revision,
        "dry_run": dry_run,
        "attempts_checked": len(attempts),
        "attempts_changed": len(changes),
        "changes": changes,
    }


def grades(quiz: Quiz) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    all_attempts = db.session.execute(
        select(Attempt.student, Attempt.status, Attempt.id, Attempt.score, Attempt.submitted_at)
        .where(Attempt.quiz_id == quiz.id)
        .order_by(Attempt.student, Attempt.submitted_at, Attempt.id)
    ).all()
    for student, status, attempt_id, score, submitted_at in all_attempts:
        row = rows.setdefault(
            student,
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


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    # A name starting with = + - @ would run as a formula when the CSV is opened in a
    # spreadsheet; the quote mark makes it inert.
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


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
        return regrade(quiz, dry_run=args["dry_run"])


@blp.route("/quizzes/<string:quiz_id>/grades")
class Grades(MethodView):
    @endpoint(blp, roles=("instructor",), errors=(404,))
    @blp.response(200, GradesSchema)
    def get(self, quiz_id: str) -> dict[str, Any]:
        """Grades (JSON)

        One row per student: submitted attempts, best and last attempt with scores, and the
        grade by the quiz's scoring policy.
        """
        return grades(load_quiz_or_404(quiz_id))


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
        data = grades(load_quiz_or_404(quiz_id))
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\r\n")
        writer.writerow(CSV_COLUMNS)
        for row in data["students"]:
            writer.writerow([_csv_cell(row[c]) for c in CSV_COLUMNS])
        return Response(
            buf.getvalue(),
            mimetype="text/csv",
            headers={"Content-Disposition": f'attachment; filename="{quiz_id}-grades.csv"'},
        )
