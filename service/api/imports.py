"""Import a quiz from an LMS file: ``POST /api/v1/quizzes/import`` (instructors).

The same reader as ``kgrade import`` (``service.imports``); the quiz is then stored exactly as
``POST /api/v1/quizzes`` stores one, so an id that already exists is a 409 and never overwrites.
"""

from __future__ import annotations

from typing import Any

from flask import request
from flask.views import MethodView
from flask_smorest import abort
from marshmallow import Schema, fields

from item_bank import dump_quiz
from service import quizzes_store as store
from service.api.common import Blueprint, endpoint, field_error, file_upload_body
from service.api.errors import ErrorSchema
from service.api.schemas import QuizDataSchema
from service.extensions import db
from service.imports import ImportFailed, import_quiz

blp = Blueprint(
    "quiz-imports",
    __name__,
    url_prefix="/api/v1",
    description="Instructors import quizzes from Moodle XML, Canvas QTI 1.2, QTI 2.1 and Common "
    "Cartridge files.",
)


class ImportedQuizSchema(Schema):
    quiz = fields.Nested(QuizDataSchema, required=True)
    format = fields.String(
        required=True,
        metadata={"description": "what the file was read as: moodle-xml, qti12, imscc or qti21"},
    )
    warnings = fields.List(
        fields.String(),
        required=True,
        metadata={"description": "what the bank could not take or had to fill in, one per line"},
    )


def _upload() -> tuple[bytes, str]:
    if request.mimetype != "multipart/form-data":
        abort(415, message="send multipart/form-data with the quiz file in the 'file' field")
    upload = request.files.get("file")
    if upload is None:
        field_error(422, "files", "file", "missing: send the quiz file as the multipart field")
    assert upload is not None
    return upload.read(), upload.filename or "upload"


@blp.route("/quizzes/import")
class QuizImport(MethodView):
    @endpoint(blp, roles=("instructor",), errors=(409, 413, 422), write=True)
    @blp.doc(requestBody=file_upload_body({"quiz_id": {"type": "string"}}))
    @blp.response(201, ImportedQuizSchema)
    @blp.alt_response(415, schema=ErrorSchema, description="Not multipart/form-data")
    def post(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        """Import a quiz from an LMS file

        Multipart fields: `file` (Moodle XML, a Canvas QTI 1.2 zip, a QTI 2.1 package or an
        `.imscc` cartridge; the format is recognised from the content) and optional `quiz_id`
        (default: the id in the file). The quiz is validated like any quiz and stored; the
        answer holds it with `warnings` naming everything the file's format could not carry,
        every question skipped (unsupported types) and every placeholder filled in. 422 names
        the field for an unreadable file or one with no importable question; 409 if a quiz
        with that id exists (nothing is overwritten: pick another `quiz_id`).
        """
        data, filename = _upload()
        quiz_id = request.form.get("quiz_id") or None
        try:
            result = import_quiz(data, filename, quiz_id=quiz_id)
        except ImportFailed as exc:
            location = "form" if exc.field == "quiz_id" else "files"
            abort(
                exc.status,
                message=f"{exc.field}: {exc}",
                errors={
                    location: {
                        exc.field: [str(exc)],
                        **({"warnings": exc.warnings} if exc.warnings else {}),
                    }
                },
            )
            raise
        try:
            report = store.create_quiz(db.session, result.quiz)
        except store.QuizExists as exc:
            field_error(
                409, "form", "quiz_id", f"{exc}; send another quiz_id to import it beside it"
            )
            raise
        body = {
            "quiz": dump_quiz(report.quiz),
            "format": result.format,
            "warnings": result.warnings,
        }
        return body, 201, {"Location": f"/api/v1/quizzes/{report.quiz.id}"}
