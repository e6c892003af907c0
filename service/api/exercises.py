"""Kernel exercises: submit a solution for grading, follow its progress, see the leaderboard.

A thin HTTP adapter: the exercise catalogue is ``workers.exercises``, the tables are
``workers.store`` (via ``service.db.submissions``) and grading is the Celery task
``workers.tasks.grade_submission``, which takes only the submission id. The task is enqueued
after the request's transaction commits (a ``after_commit`` hook), so a worker never looks for a
row that is not there yet and a rolled-back request enqueues nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import uuid
from datetime import datetime, timedelta
from typing import Any

from flask import current_app, request
from flask.views import MethodView
from flask_smorest import abort
from marshmallow import Schema, fields
from sqlalchemy import event, func, insert, select, text
from sqlalchemy.orm import Session

from service.api.common import (
    Blueprint,
    ErrorSchema,
    endpoint,
    error,
    field_error,
    parse_json_body,
)
from service.auth import Principal, current_principal
from service.db import is_postgres
from service.db.base import utcnow
from service.db.submissions import submissions
from service.extensions import db
from workers.exercises import Exercise, ExerciseError, list_exercises, load_exercise
from workers.queues import queue_for
from workers.store import DONE, QUEUED, STATUSES, SubmissionStore, as_utc

log = logging.getLogger(__name__)

blp = Blueprint(
    "exercises",
    __name__,
    url_prefix="/api/v1",
    description="Kernel exercises: submit a solution (graded asynchronously by a Celery worker), "
    "poll its status and progress, and see who is fastest.",
)

#: Largest accepted source, in bytes of UTF-8 (``KGRADE_MAX_SOURCE_BYTES``).
DEFAULT_MAX_SOURCE_BYTES = 256 * 1024
#: Per-student submissions per window, "N/SECONDS" (``KGRADE_SUBMISSION_RATE``).
DEFAULT_RATE = "6/60"


def _setting(key: str, env: str, default: Any) -> Any:
    """App config (tests pass overrides), then the environment, then the default."""
    value = current_app.config.get(key)
    if value is None:
        value = os.environ.get(env) or default
    return value


def _max_source_bytes() -> int:
    return int(_setting("MAX_SOURCE_BYTES", "KGRADE_MAX_SOURCE_BYTES", DEFAULT_MAX_SOURCE_BYTES))


def _rate() -> tuple[int, int]:
    raw = str(_setting("SUBMISSION_RATE", "KGRADE_SUBMISSION_RATE", DEFAULT_RATE))
    count, _, seconds = raw.partition("/")
    return int(count), int(seconds or 60)


def _grade_device() -> str:
    """Where submissions are graded: ``cpu`` (default; CPU workers) or ``cuda`` (GPU workers)."""
    device = str(_setting("GRADE_DEVICE", "KGRADE_GRADE_DEVICE", "cpu"))
    if device not in ("cpu", "cuda"):
        raise RuntimeError(f"KGRADE_GRADE_DEVICE must be cpu or cuda, not {device!r}")
    return device


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
            "confirm-tests, confirm-benchmark (a second run with new hidden cases), done; "
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
            "see it without the staff-only logs and diagnostics"
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


def _exercise_or_404(exercise_id: str) -> Exercise:
    try:
        return load_exercise(exercise_id)
    except ExerciseError:
        field_error(404, "path", "exercise_id", f"unknown exercise {exercise_id!r}")
        raise  # unreachable: field_error aborts


def _read_source(ex: Exercise) -> tuple[str, str | None, bool]:
    """The submitted source from a multipart ``file`` or a JSON ``source``; 4xx naming the field.

    The third value says the source is the exercise's own reference (instructors only).
    """
    limit = _max_source_bytes()
    if request.mimetype == "multipart/form-data":
        location, field = "files", "file"
        upload = request.files.get("file")
        if upload is None:
            field_error(422, location, field, "missing: send the source as the multipart field")
        assert upload is not None
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
            field_error(422, location, "reference", "must be a boolean")
        if reference:
            if not current_principal().is_instructor:
                error(403, "only instructors may grade the reference")
            if "source" in body:
                field_error(422, location, "reference", "send either 'source' or 'reference'")
            return ex.reference.read_text(encoding="utf-8"), "reference.py", True
        source = body.get("source")
        if not isinstance(source, str):
            field_error(422, location, field, "required: the Python source as a string")
        assert isinstance(source, str)
        filename = body.get("filename")
        if filename is not None and not isinstance(filename, str):
            field_error(422, location, "filename", "must be a string")
        try:
            # JSON can carry lone surrogates ("\udc80"), which are not UTF-8.
            raw = source.encode("utf-8")
        except UnicodeEncodeError:
            field_error(422, location, field, "is not valid UTF-8 (lone surrogate)")
    else:
        abort(
            415,
            message="send multipart/form-data with a 'file' field, or application/json with "
            "a 'source' string",
        )
    if len(raw) > limit:
        field_error(413, location, field, f"source is over the limit of {limit} bytes")
    if not raw.strip():
        field_error(422, location, field, "the source is empty")
    try:
        text_source = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        field_error(422, location, field, f"is not valid UTF-8 (byte {exc.start})")
    if "\x00" in text_source:
        field_error(422, location, field, "contains a NUL character")
    if filename is not None:
        filename = os.path.basename(filename.replace("\\", "/"))[:255] or None
    return text_source, filename, False


def _check_rate(session: Session, principal: Principal) -> None:
    """Per-student limit over a sliding window, counted in the DB (shared by all API processes).

    Instructors are not limited (they grade references and re-runs).
    """
    if principal.is_instructor:
        return
    limit, window = _rate()
    if is_postgres(session.get_bind()):
        # Serialise this student's concurrent posts so two cannot both pass the count.
        digest = hashlib.sha256(f"submit:{principal.name}".encode()).digest()
        key = int.from_bytes(digest[:8], "big", signed=True)
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
    since = utcnow() - timedelta(seconds=window)
    t = submissions
    count, oldest = session.execute(
        select(func.count(), func.min(t.c.created_at)).where(
            t.c.student == principal.name, t.c.created_at > since
        )
    ).one()
    if count >= limit:
        oldest = as_utc(oldest) or utcnow()
        retry = max(1, math.ceil((oldest + timedelta(seconds=window) - utcnow()).total_seconds()))
        abort(
            429,
            message=f"rate limit: at most {limit} submissions per {window} s; retry in {retry} s",
            headers={"Retry-After": str(retry)},
        )


def _enqueue_after_commit(session: Session, submission_id: int, queue: str, task_id: str) -> None:
    """Send the task once the transaction holding the row has committed, never before."""
    state = {"armed": True}

    def _send(_session: Session) -> None:
        if not state["armed"]:
            return
        state["armed"] = False
        from workers.tasks import grade_submission  # the Celery app loads on first use

        try:
            grade_submission.apply_async(args=[submission_id], queue=queue, task_id=task_id)
        except Exception as exc:  # noqa: BLE001 - the row is committed; say why it will not run
            log.exception("could not enqueue submission %s", submission_id)
            SubmissionStore(engine=db.engine).save_result(
                submission_id,
                0,
                {
                    "score": 0.0,
                    "gradable": False,
                    "verdict": "INFRA_ERROR",
                    "output": f"the grading queue is unavailable ({type(exc).__name__}); "
                    "this was not charged, please submit again later",
                    "tests": [],
                    "leaderboard": [],
                },
            )

    def _disarm(_session: Session) -> None:
        state["armed"] = False

    event.listen(session, "after_commit", _send, once=True)
    event.listen(session, "after_rollback", _disarm, once=True)


def _visible_result(result: dict[str, Any] | None, principal: Principal) -> dict[str, Any] | None:
    if result is None or principal.is_instructor:
        return result
    shown = dict(result)
    staff = dict(shown.get("kgrade") or {})
    for key in ("logs", "details", "harness_hash", "run_id"):
        staff.pop(key, None)
    if staff:
        shown["kgrade"] = staff
    else:
        shown.pop("kgrade", None)
    return shown


def _submission_view(row: Any, result: dict[str, Any] | None, p: Principal) -> dict[str, Any]:
    return {
        "id": row.id,
        "exercise_id": row.exercise_id,
        "student": row.student,
        "filename": row.filename,
        "reference": row.reference,
        "source_sha256": row.source_sha256,
        "status": row.status,
        "device": row.device,
        "queue": row.queue,
        "attempts": row.attempts,
        "progress": {
            "phase": row.progress_phase,
            "done": row.progress_done,
            "total": row.progress_total,
        },
        "verdict": row.verdict,
        "score": row.score,
        "speedup": row.speedup,
        "gradable": row.gradable,
        "created_at": as_utc(row.created_at),
        "started_at": as_utc(row.started_at),
        "finished_at": as_utc(row.finished_at),
        "result": _visible_result(result, p) if row.status == DONE else None,
    }


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
        ex = _exercise_or_404(exercise_id)
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
    )
    @blp.doc(
        requestBody={
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "properties": {"file": {"type": "string", "format": "binary"}},
                        "required": ["file"],
                    }
                },
                "application/json": {"schema": SubmissionJsonSchema},
            },
        }
    )
    @blp.response(202, SubmissionCreatedSchema)
    @blp.alt_response(
        415, schema=ErrorSchema, description="Neither multipart/form-data nor application/json"
    )
    @blp.alt_response(
        429,
        schema=ErrorSchema,
        description="Per-student submission rate exceeded; see the Retry-After header",
    )
    def post(self, exercise_id: str) -> tuple[dict[str, Any], int, dict[str, str]]:
        """Submit a solution for grading

        The source is a multipart file field `file` or a JSON `source` string: UTF-8, at most
        256 KiB (configurable). Returns 202 at once; grading runs on a worker. Poll
        `GET /api/v1/submissions/{id}` for status, progress and the result.
        """
        ex = _exercise_or_404(exercise_id)
        source, filename, reference = _read_source(ex)
        principal = current_principal()
        session = db.session
        _check_rate(session, principal)
        device = _grade_device()
        queue = queue_for(device, ex.world_size)
        task_id = str(uuid.uuid4())
        submission_id = session.execute(
            insert(submissions)
            .values(
                exercise_id=ex.id,
                student=principal.name,
                token_id=principal.token_id,
                source=source,
                source_sha256=hashlib.sha256(source.encode("utf-8")).hexdigest(),
                filename=filename,
                reference=reference,
                device=device,
                queue=queue,
                status=QUEUED,
                task_id=task_id,
                attempts=0,
                progress_phase="queued",
                progress_done=0,
                created_at=utcnow(),
            )
            .returning(submissions.c.id)
        ).scalar_one()
        _enqueue_after_commit(session, submission_id, queue, task_id)
        url = f"/api/v1/submissions/{submission_id}"
        body = {"id": submission_id, "status": QUEUED, "queue": queue, "url": url}
        return body, 202, {"Location": url}


@blp.route("/submissions/<int:submission_id>")
class SubmissionById(MethodView):
    @endpoint(blp, roles=("student", "instructor"), errors=(404,))
    @blp.response(200, SubmissionSchema)
    def get(self, submission_id: int) -> dict[str, Any]:
        """Show a submission: status, progress and, once done, the result

        Students may read only their own submissions.
        """
        t = submissions
        row = db.session.execute(select(t).where(t.c.id == submission_id)).first()
        if row is None:
            field_error(404, "path", "submission_id", f"unknown submission {submission_id}")
        assert row is not None
        principal = current_principal()
        if not principal.is_instructor and row.student != principal.name:
            error(403, "this submission belongs to another student")
        result = None
        if row.status == DONE and row.result_attempt is not None:
            r = SubmissionStore(engine=db.engine).results(submission_id)
            result = next((x["result"] for x in r if x["attempt"] == row.result_attempt), None)
        return _submission_view(row, result, principal)


@blp.route("/exercises/<string:exercise_id>/leaderboard")
class Leaderboard(MethodView):
    @endpoint(blp, roles=("student", "instructor"), errors=(404,))
    @blp.response(200, LeaderboardSchema)
    def get(self, exercise_id: str) -> dict[str, Any]:
        """Rank students by the speed of their best passing submission

        One entry per student: the highest speedup (geometric mean of t_ref/t_sub over the
        hidden benchmark shapes) among passing submissions; ties go to the earlier one. A
        speedup counts only once a second run with new hidden cases confirmed it, at the lower
        of the two runs' speedups.
        Students see their own name; other students' are null.
        """
        ex = _exercise_or_404(exercise_id)
        t = submissions
        rows = db.session.execute(
            select(t.c.id, t.c.student, t.c.speedup, t.c.score, t.c.finished_at)
            .where(
                t.c.exercise_id == ex.id,
                t.c.verdict == "PASS",
                t.c.speedup.is_not(None),
                t.c.reference.is_(False),
            )
            .order_by(t.c.speedup.desc(), t.c.finished_at.asc(), t.c.id.asc())
        ).all()
        principal = current_principal()
        entries: list[dict[str, Any]] = []
        seen: set[str] = set()
        for row in rows:
            if row.student in seen:
                continue
            seen.add(row.student)
            own = principal.is_instructor or row.student == principal.name
            entries.append(
                {
                    "rank": len(entries) + 1,
                    "student": row.student if own else None,
                    "submission_id": row.id if own else None,
                    "speedup": row.speedup,
                    "score": row.score,
                    "finished_at": as_utc(row.finished_at) or datetime.min,
                }
            )
        return {"exercise_id": ex.id, "entries": entries}
