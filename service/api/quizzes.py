"""Quizzes: list and view (students and instructors), create and update (instructors), export."""

from __future__ import annotations

from typing import Any

from flask import Response, request
from flask.views import MethodView
from marshmallow import Schema, fields, validate
from sqlalchemy import func, select

from item_bank import BankError, dump_quiz
from item_bank.model import Quiz
from service import quizzes_store as store
from service.api.common import Blueprint, endpoint, error, field_error, parse_json_body
from service.api.schemas import (
    LangQuerySchema,
    QuizDataSchema,
    QuizSummarySchema,
    QuizViewSchema,
)
from service.auth import current_principal
from service.core.attempts import load_quiz
from service.core.views import quiz_summary, quiz_view
from service.db.attempts import Attempt
from service.extensions import db

blp = Blueprint(
    "quizzes",
    __name__,
    url_prefix="/api/v1",
    description="Quizzes: students list and view them (no answer key); instructors also create, "
    "update and export them.",
)

QUIZ_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A quiz in the item bank's data-file schema (item_bank/quizzes/*.yaml as "
        "JSON). Validated by the item bank's rules; every problem is reported under `errors.json` "
        "keyed by field path (e.g. `items.0.options.1.feedback`).",
        "content": {"application/json": {"schema": QuizDataSchema}},
    }
}


class ItemRevisionChangeSchema(Schema):
    id = fields.String(required=True)
    old_revision = fields.Integer(required=True)
    new_revision = fields.Integer(required=True)


class QuizChangeSchema(Schema):
    quiz = fields.Nested(QuizDataSchema, required=True)
    created = fields.Boolean(required=True)
    previous_revision = fields.Integer(allow_none=True)
    revision = fields.Integer(required=True)
    changed_items = fields.List(fields.Nested(ItemRevisionChangeSchema), required=True)
    added_items = fields.List(fields.String(), required=True)
    removed_items = fields.List(fields.String(), required=True)


try:  # the exports library lists its choices; the endpoint answers 503 without it
    from service.exports import FORMATS as _FORMATS
    from service.exports import LANG_MODES as _LANG_MODES
    from service.exports import MLANG_SYNTAXES as _MLANG_SYNTAXES
except ImportError:  # pragma: no cover - only in a build without service.exports
    _FORMATS, _LANG_MODES, _MLANG_SYNTAXES = {}, (), ()


def _one_of(choices: Any) -> list[validate.Validator]:
    return [validate.OneOf(list(choices))] if choices else []


class ExportQuerySchema(Schema):
    format = fields.String(
        required=True,
        validate=_one_of(_FORMATS),
        metadata={"description": "export format, as `kgrade export --format` accepts it"},
    )
    lang = fields.String(
        load_default="en",
        validate=_one_of(_LANG_MODES),
        metadata={"description": "language mode, as for the CLI export"},
    )
    mlang = fields.String(
        load_default="spans",
        validate=_one_of(_MLANG_SYNTAXES),
        metadata={"description": "how multilingual text is marked up for Moodle (CLI `--mlang`)"},
    )


def load_quiz_or_404(quiz_id: str) -> Quiz:
    return load_quiz(db.session, quiz_id)


def json_body() -> Any:
    raw = request.get_data(cache=True)
    if not raw.strip():
        field_error(422, "json", "_schema", "a JSON body is required")
    try:
        return parse_json_body(raw)
    except ValueError:
        error(400, "the request body is not valid JSON", json=["Invalid JSON body."])


def parse_quiz_body(quiz_id: str | None = None) -> Quiz:
    data = json_body()
    try:
        return store.parse_quiz_data(data, quiz_id=quiz_id)
    except BankError as exc:
        fields_ = exc.fields or {"_schema": exc.messages}
        error(422, "; ".join(exc.messages[:3]), json=fields_)
        raise  # unreachable


def change_report(report: store.RevisionReport) -> dict[str, Any]:
    return {
        "quiz": dump_quiz(report.quiz),
        "created": report.created,
        "previous_revision": report.quiz_revision_before,
        "revision": report.quiz.revision,
        "changed_items": [
            {"id": i, "old_revision": a, "new_revision": b} for i, a, b in report.changed_items
        ],
        "added_items": [] if report.created else report.added_items,
        "removed_items": report.removed_items,
    }


@blp.route("/quizzes")
class Quizzes(MethodView):
    @endpoint(blp, roles=("instructor", "student"), errors=(422,))
    @blp.arguments(LangQuerySchema, location="query")
    @blp.response(200, QuizSummarySchema(many=True))
    def get(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        """List quizzes

        Titles and descriptions in the requested language. For students, `attempts_used`
        counts their attempts at each quiz outside assignments (assignments count their own).
        """
        quizzes = store.list_quizzes(db.session)
        out = [quiz_summary(q, args["lang"]) for q in quizzes]
        principal = current_principal()
        if not principal.is_instructor:
            used = dict(
                db.session.execute(
                    select(Attempt.quiz_id, func.count())
                    .where(
                        Attempt.user_id == principal.user_id,
                        Attempt.course_id == principal.course_id,
                        Attempt.assignment_id.is_(None),
                    )
                    .group_by(Attempt.quiz_id)
                ).all()
            )
            for row in out:
                row["attempts_used"] = used.get(row["id"], 0)
        return out

    @endpoint(blp, roles=("instructor",), errors=(400, 409, 413, 422), write=True)
    @blp.doc(**QUIZ_BODY_DOC)
    @blp.response(201, QuizChangeSchema)
    def post(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        """Create a quiz

        The body is a quiz in the item bank's data-file schema. Item revisions start as given
        (default 1). 409 if a quiz with that id exists (use PUT to change it).
        """
        quiz = parse_quiz_body()
        try:
            report = store.create_quiz(db.session, quiz)
        except store.QuizExists as exc:
            field_error(409, "json", "id", str(exc))
            raise
        return change_report(report), 201, {"Location": f"/api/v1/quizzes/{quiz.id}"}


@blp.route("/quizzes/<string:quiz_id>")
class QuizById(MethodView):
    @endpoint(blp, roles=("instructor", "student"), errors=(404, 422))
    @blp.arguments(LangQuerySchema, location="query")
    @blp.response(200, QuizViewSchema)
    def get(self, args: dict[str, Any], quiz_id: str) -> dict[str, Any]:
        """Show a quiz

        Students get prompts and options only: no correct flags, feedback or explanations (those
        come with each answer in an attempt). Instructors also get the key.
        """
        quiz = load_quiz_or_404(quiz_id)
        return quiz_view(quiz, args["lang"], with_key=current_principal().is_instructor)

    @endpoint(blp, roles=("instructor",), errors=(400, 404, 413, 422), write=True)
    @blp.doc(**QUIZ_BODY_DOC)
    @blp.response(200, QuizChangeSchema)
    def put(self, quiz_id: str) -> dict[str, Any]:
        """Replace a quiz

        Same schema as creation (the body's `id` may be omitted; if given it must match the
        URL). Every item whose content changed gets its revision bumped, and the quiz revision
        is bumped on any change; revisions in the body are ignored. Existing attempts keep the
        scores they were graded with until a regrade.
        """
        new = parse_quiz_body(quiz_id)
        try:
            report = store.update_quiz(db.session, quiz_id, new)
        except store.QuizNotFound:
            field_error(404, "path", "quiz_id", f"unknown quiz {quiz_id!r}")
            raise
        return change_report(report)


@blp.route("/quizzes/<string:quiz_id>/data")
class QuizData(MethodView):
    @endpoint(blp, roles=("instructor",), errors=(404,))
    @blp.response(200, QuizDataSchema)
    def get(self, quiz_id: str) -> dict[str, Any]:
        """Get a quiz's data file

        The quiz in the item bank's data-file schema, with current revisions: edit it and PUT it
        back to `/api/v1/quizzes/{quiz_id}`.
        """
        return dump_quiz(load_quiz_or_404(quiz_id))


@blp.route("/quizzes/<string:quiz_id>/export")
class QuizExport(MethodView):
    @endpoint(blp, roles=("instructor",), errors=(404, 422, 503))
    @blp.arguments(ExportQuerySchema, location="query")
    @blp.response(
        200,
        description="The export file: the same bytes as `kgrade export` writes, with its media "
        "type and a Content-Disposition file name.",
        content_type="application/octet-stream",
    )
    def get(self, args: dict[str, Any], quiz_id: str) -> Response:
        """Export a quiz for an LMS

        Same output as the CLI export for the same format and language.
        """
        quiz = load_quiz_or_404(quiz_id)
        try:
            from service.exports import export_quiz
        except ImportError:
            error(503, "the exports library is not installed in this build")
            raise
        try:
            result = export_quiz(quiz, args["format"], args["lang"], mlang=args["mlang"])
        except ValueError as exc:
            msg = str(exc)
            lowered = msg.lower()
            name = "lang" if "lang" in lowered and "format" not in lowered else "format"
            if "mlang" in lowered:
                name = "mlang"
            field_error(422, "query", name, msg)
            raise
        return Response(
            result.data,
            mimetype=result.media_type,
            headers={"Content-Disposition": f'attachment; filename="{result.filename}"'},
        )
