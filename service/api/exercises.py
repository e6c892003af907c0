"""Kernel exercises over HTTP: submit a solution for grading, follow its progress, see the
course's leaderboard. A thin adapter over ``service.core.submissions`` (storage,
queueing after the commit, scoping) and ``workers.exercises`` (the catalogue); the
per-student rate limit is ``service.extensions.SUBMISSIONS`` (flask-limiter).
"""

from __future__ import annotations

import json
from typing import Any

from flask import current_app, request
from flask.views import MethodView
from flask_smorest import abort
from marshmallow import Schema, fields

from service.api.common import (
    Blueprint,
    ErrorSchema,
    db_id,
    endpoint,
    error,
    file_upload_body,
    parse_json_body,
)
from service.auth import current_principal
from service.core import assignments
from service.core import submissions as submissions_
from service.core.errors import invalid
from service.db.courses import EXERCISE
from service.extensions import db
from workers.exercises import Exercise, list_exercises, load_exercise
from workers.store import STATUSES

blp = Blueprint(
    "exercises",
    __name__,
    url_prefix="/api/v1",
    description="Kernel exercises: submit a solution (graded asynchronously by a Celery worker), "
    "poll its status and progress, and see who is fastest.",
)

# --- schemas ---------------------------------------------------------------------------------


class ExerciseSummarySchema(Schema):
    id = fields.String(required=True)
    title = fields.String(required=True)
    entry = fields.String(required=True, metadata={"description": "function to implement"})
    signature = fields.String(required=True)
    world_size = fields.Integer(required=True, metadata={"description": "GPUs (ranks) used"})


class ExerciseSchema(ExerciseSummarySchema):
    readme = fields.String(required=True, metadata={"description": "the task, Markdown"})
    starter = fields.String(required=True, metadata={"description": "starter source file"})


class SubmissionJsonSchema(Schema):
    """Documents the JSON form of the request body (multipart is the other)."""

    source = fields.String(required=True, metadata={"description": "Python source, UTF-8"})
    filename = fields.String(metadata={"description": "optional, shown back to you"})
    reference = fields.Boolean(
        metadata={
            "description": "instructors only, instead of `source`: grade the exercise's own "
            "reference (a harness check: its speedup should be ~1.0; never ranked)"
        }
    )


class SubmissionCreatedSchema(Schema):
    id = fields.Integer(required=True, metadata={"description": "submission id"})
    status = fields.String(required=True, metadata={"enum": list(STATUSES)})
    queue = fields.String(required=True, metadata={"description": "Celery queue it waits in"})
    url = fields.String(required=True, metadata={"description": "poll this for the result"})


class ProgressSchema(Schema):
    phase = fields.String(
        allow_none=True,
        metadata={
            "description": "queued, starting, grading, then import, tests (cases), "
            "benchmark (shapes; GPU only), for a passing timed submission confirm-import, "
            "confirm-tests, confirm-benchmark (a second run with new hidden cases; its benchmark "
            "only for a speedup at or above the exercise's target), done; "
            "requeued when a timed run met the GPU off its baseline's state and waits to run "
            "again (KGRADE_CANARY_REQUEUES)"
        },
    )
    done = fields.Integer(allow_none=True, metadata={"description": "finished in this phase"})
    total = fields.Integer(allow_none=True, metadata={"description": "null while unknown"})


class SubmissionSchema(Schema):
    id = fields.Integer(required=True)
    exercise_id = fields.String(required=True)
    student = fields.String(required=True)
    filename = fields.String(allow_none=True)
    reference = fields.Boolean(required=True, metadata={"description": "a reference run"})
    source_sha256 = fields.String(required=True)
    status = fields.String(required=True, metadata={"enum": list(STATUSES)})
    device = fields.String(required=True)
    queue = fields.String(required=True)
    attempts = fields.Integer(
        required=True, metadata={"description": "deliveries that started grading"}
    )
    progress = fields.Nested(ProgressSchema, required=True)
    verdict = fields.String(allow_none=True, metadata={"description": "null until done"})
    score = fields.Float(allow_none=True, metadata={"description": "0..1, null until done"})
    speedup = fields.Float(allow_none=True, metadata={"description": "passing runs only"})
    gradable = fields.Boolean(allow_none=True)
    created_at = fields.DateTime(required=True)
    started_at = fields.DateTime(allow_none=True)
    finished_at = fields.DateTime(allow_none=True)
    result = fields.Dict(
        allow_none=True,
        metadata={
            "description": "results.json (Gradescope/PrairieLearn union) once done; students "
            "see it without the staff-only logs and diagnostics. GPU results carry the "
            "kernel's roofline position beside the speedup: kgrade.roofline (peak_frac, the "
            "geometric mean over shapes of roofline time / median time, with the peaks) and "
            "kgrade.timings[].roofline (tflops, tbytes_s, flops_frac, bytes_frac, bound, "
            "peak_frac); null on CPU"
        },
    )


class LeaderboardEntrySchema(Schema):
    rank = fields.Integer(required=True)
    student = fields.String(
        allow_none=True, metadata={"description": "null for other students when a student asks"}
    )
    submission_id = fields.Integer(allow_none=True)
    speedup = fields.Float(required=True, metadata={"description": "geometric-mean t_ref/t_sub"})
    score = fields.Float(required=True)
    finished_at = fields.DateTime(required=True)


class LeaderboardSchema(Schema):
    exercise_id = fields.String(required=True)
    entries = fields.List(fields.Nested(LeaderboardEntrySchema), required=True)


# --- helpers ---------------------------------------------------------------------------------


def _read_source(ex: Exercise) -> tuple[str, str | None, bool]:
    """The submitted source from a multipart ``file`` or a JSON ``source``; 4xx naming the field.

    The third value says the source is the exercise's own reference (instructors only).
    """
    limit = submissions_.max_source_bytes(current_app.config)
    if request.mimetype == "multipart/form-data":
        location, field = "files", "file"
        upload = request.files.get("file")
        if upload is None:
            raise invalid(location, field, "missing: send the source as the multipart field")
        raw = upload.read(limit + 1)
        filename = upload.filename or None
    elif request.mimetype == "application/json":
        location, field = "json", "source"
        try:
            body = parse_json_body(request.get_data(cache=True))
        except json.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            error(400, "the body must be a JSON object with a 'source' string")
        assert isinstance(body, dict)
        reference = body.get("reference", False)
        if not isinstance(reference, bool):
            raise invalid(location, "reference", "must be a boolean")
        if reference:
            if not current_principal().is_instructor:
                error(403, "only instructors may grade the reference")
            if "source" in body:
                raise invalid(location, "reference", "send either 'source' or 'reference'")
            return ex.reference.read_text(encoding="utf-8"), "reference.py", True
        source = body.get("source")
        if not isinstance(source, str):
            raise invalid(location, field, "required: the Python source as a string")
        filename = body.get("filename")
        if filename is not None and not isinstance(filename, str):
            raise invalid(location, "filename", "must be a string")
        try:
            # JSON can carry lone surrogates ("\udc80"), which are not UTF-8.
            raw = source.encode("utf-8")
        except UnicodeEncodeError:
            raise invalid(location, field, "is not valid UTF-8 (lone surrogate)") from None
    else:
        abort(
            415,
            message="send multipart/form-data with a 'file' field, or application/json with "
            "a 'source' string",
        )
    text_source = submissions_.decode_source(raw, limit, location, field)
    return text_source, submissions_.clean_filename(filename), False


def _assignment_arg(ex: Exercise) -> Any:
    return assignments.for_target(
        db.session,
        current_principal(),
        request.args.get("assignment_id"),
        EXERCISE,
        ex.id,
        "query",
    )


# --- views -----------------------------------------------------------------------------------


@blp.route("/exercises")
class Exercises(MethodView):
    @endpoint(blp, roles=("student", "instructor"))
    @blp.response(200, ExerciseSummarySchema(many=True))
    def get(self) -> list[dict[str, Any]]:
        """List the kernel exercises"""
        return [_summary(load_exercise(eid)) for eid in list_exercises()]


def _summary(ex: Exercise) -> dict[str, Any]:
    return {
        "id": ex.id,
        "title": ex.title,
        "entry": ex.entry,
        "signature": ex.signature,
        "world_size": ex.world_size,
    }


@blp.route("/exercises/<string:exercise_id>")
class ExerciseById(MethodView):
    @endpoint(blp, roles=("student", "instructor"), errors=(404,))
    @blp.response(200, ExerciseSchema)
    def get(self, exercise_id: str) -> dict[str, Any]:
        """Show an exercise: its task and starter file"""
        ex = submissions_.exercise(exercise_id)
        starter = ex.starter.read_text() if ex.starter.is_file() else ""
        return {**_summary(ex), "readme": ex.readme, "starter": starter}


@blp.route("/exercises/<string:exercise_id>/submissions")
class ExerciseSubmissions(MethodView):
    @endpoint(
        blp,
        roles=("student", "instructor"),
        errors=(400, 404, 413, 422),
        write=True,
        idempotent=True,
        rate_limit="submissions",  # per student, KGRADE_SUBMISSION_RATE; instructors exempt
    )
    @blp.doc(requestBody=file_upload_body(**{"application/json": {"schema": SubmissionJsonSchema}}))
    @blp.response(202, SubmissionCreatedSchema)
    @blp.alt_response(
        415, schema=ErrorSchema, description="Neither multipart/form-data nor application/json"
    )
    def post(self, exercise_id: str) -> tuple[dict[str, Any], int, dict[str, str]]:
        """Submit a solution for grading

        The source is a multipart file field `file` or a JSON `source` string: UTF-8, at most
        256 KiB (configurable). Returns 202 at once; grading runs on a worker. Poll
        `GET /api/v1/submissions/{id}` for status, progress and the result.
        Students are rate limited (accepted submissions per window, `x-rate-limit`; 429 with
        `Retry-After` beyond it); instructors are not.
        """
        ex = submissions_.exercise(exercise_id)
        source, filename, reference = _read_source(ex)
        created = submissions_.create(
            db.session,
            current_principal(),
            ex,
            source,
            filename,
            current_app.config,
            reference=reference,
            assignment=_assignment_arg(ex),
        )
        url = f"/api/v1/submissions/{created['id']}"
        return {**created, "url": url}, 202, {"Location": url}


@blp.route("/submissions/<db_id:submission_id>")
class SubmissionById(MethodView):
    @endpoint(blp, roles=("student", "instructor"), errors=(404,))
    @blp.response(200, SubmissionSchema)
    def get(self, submission_id: int) -> dict[str, Any]:
        """Show a submission: status, progress and, once done, the result

        Students may read only their own submissions.
        """
        actor = current_principal()
        row = submissions_.get(db.session, actor, db_id(submission_id, "submission_id"))
        return submissions_.view(row, submissions_.final_result(db.session, row), actor)


@blp.route("/exercises/<string:exercise_id>/leaderboard")
class Leaderboard(MethodView):
    @endpoint(blp, roles=("student", "instructor"), errors=(404,))
    @blp.response(200, LeaderboardSchema)
    def get(self, exercise_id: str) -> dict[str, Any]:
        """Rank students by the speed of their best passing submission

        One entry per student: the highest speedup (geometric mean of t_ref/t_sub over the
        hidden benchmark shapes) among passing submissions; ties go to the earlier one. A
        speedup counts only once a second run with new hidden cases passed; one at or above the
        exercise's target speedup is timed again there and counts at the lower of the two.
        Students see their own name; other students' are null.
        """
        ex = submissions_.exercise(exercise_id)
        entries = submissions_.leaderboard(db.session, current_principal(), ex.id)
        return {"exercise_id": ex.id, "entries": entries}
