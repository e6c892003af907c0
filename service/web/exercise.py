"""Kernel exercises: the statement, the starter file, an editor and file upload, then the
grading's live progress (polled as JSON) and its result: verdict explained, tests, per-shape
timings against the reference, the course leaderboard, and past submissions."""

from __future__ import annotations

from typing import Any

from flask import Response, current_app, jsonify, redirect, request, url_for

from service.core import assignments, submissions
from service.core.errors import ServiceError, invalid
from service.db import write_intent
from service.db.courses import EXERCISE, Assignment
from service.extensions import db
from service.web import markdown
from service.web.guard import actor, page, render
from service.web.pages import bp
from service.web.verdicts import explain
from workers.store import DONE

#: Phases of a grading, as the progress line names them to a student.
PHASES = {
    "queued": "Waiting in the queue",
    "requeued": "Back in the queue (the GPU was busy with something else)",
    "starting": "Starting",
    "grading": "Preparing the sandbox",
    "import": "Importing your module",
    "tests": "Running the tests",
    "benchmark": "Timing your kernel",
    "confirm-import": "Confirming: importing again",
    "confirm-tests": "Confirming: new hidden tests",
    "confirm-benchmark": "Confirming: timing again",
    "done": "Done",
}


def exercise_page(exercise_id: str, assignment: Assignment | None, **extra: Any) -> Response:
    a = actor()
    ex = submissions.exercise(exercise_id)
    mine = submissions.history(db.session, a, ex.id, assignment)
    starter = ex.starter.read_text() if ex.starter.is_file() else ""
    return render(
        "web/exercise.html",
        ex=ex,
        assignment=assignment,
        title=assignment.title if assignment else ex.title,
        statement=markdown.render(ex.readme, drop_title=True),
        starter=starter,
        history=mine,
        board=submissions.leaderboard(db.session, a, ex.id),
        max_bytes=submissions.max_source_bytes(current_app.config),
        source=extra.pop("source", None) or (mine[0].source if mine else starter),
        explain=explain,
        **extra,
    )


@bp.get("/exercise/<exercise_id>")
@page()
def exercise(exercise_id: str) -> Response:
    return exercise_page(exercise_id, None)


@bp.get("/exercise/<exercise_id>/starter.py")
@page()
def starter(exercise_id: str) -> Response:
    ex = submissions.exercise(exercise_id)
    body = ex.starter.read_text() if ex.starter.is_file() else ""
    return Response(
        body,
        mimetype="text/x-python",
        headers={"Content-Disposition": f'attachment; filename="{ex.id.replace("-", "_")}.py"'},
    )


def _source_from_form(limit: int) -> tuple[str, str | None]:
    upload = request.files.get("file")
    if upload is not None and upload.filename:
        raw = upload.read(limit + 1)
        return submissions.decode_source(raw, limit, "files", "file"), submissions.clean_filename(
            upload.filename
        )
    text = request.form.get("source", "")
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid("form", "source", "is not valid UTF-8") from None
    return submissions.decode_source(raw, limit, "form", "source"), "editor.py"


@bp.post("/exercise/<exercise_id>/submit")
@page()
def submit_solution(exercise_id: str) -> Response:
    a = actor()
    ex = submissions.exercise(exercise_id)
    assignment = None
    try:
        assignment = assignments.for_target(
            db.session, a, request.form.get("assignment_id"), EXERCISE, ex.id, "form"
        )
        source, filename = _source_from_form(submissions.max_source_bytes(current_app.config))
        with write_intent():
            db.session.rollback()
            created = submissions.create(
                db.session, a, ex, source, filename, current_app.config, assignment=assignment
            )
            db.session.commit()
    except ServiceError as exc:
        db.session.rollback()
        if exc.status not in (413, 422, 429, 409):
            raise
        return _with_error(ex.id, assignment, exc)
    return redirect(url_for("web.submission", submission_id=created["id"]), code=303)


def _with_error(exercise_id: str, assignment: Assignment | None, exc: ServiceError) -> Response:
    resp = exercise_page(
        exercise_id, assignment, error=exc, source=request.form.get("source") or None
    )
    resp.status_code = exc.status
    for k, v in exc.headers.items():
        resp.headers[k] = v
    return resp


def status_view(row: Any) -> dict[str, Any]:
    phase = row.progress_phase or row.status
    return {
        "id": row.id,
        "status": row.status,
        "phase": phase,
        "phase_text": PHASES.get(phase, phase),
        "done": row.progress_done,
        "total": row.progress_total,
        "queue_position": submissions.queue_position(db.session, row),
        "verdict": row.verdict,
        "finished": row.status == DONE,
    }


@bp.get("/submissions/<row_id:submission_id>")
@page()
def submission(submission_id: int) -> Response:
    a = actor()
    row = submissions.get(db.session, a, submission_id)
    result = submissions.visible_result(submissions.final_result(db.session, row), a)
    ex = submissions.exercise(row.exercise_id)
    assignment = db.session.get(Assignment, row.assignment_id) if row.assignment_id else None
    timings = ((result or {}).get("kgrade") or {}).get("timings") or []
    return render(
        "web/submission.html",
        row=row,
        ex=ex,
        result=result,
        progress=status_view(row),
        assignment=assignment,
        timings=timings,
        chart={
            "labels": [t.get("name") for t in timings],
            "submission": [t.get("median_ms") for t in timings],
            "reference": [t.get("ref_median_ms") for t in timings],
        },
        explanation=explain(row.verdict) if row.verdict else None,
        board=submissions.leaderboard(db.session, a, ex.id),
        history=submissions.history(db.session, a, ex.id, assignment, user_id=row.user_id),
        back_url=url_for("web.assignment", assignment_id=assignment.id)
        if assignment
        else url_for("web.exercise", exercise_id=ex.id),
    )


@bp.get("/submissions/<row_id:submission_id>/status.json")
@page()
def submission_status(submission_id: int) -> Response:
    row = submissions.get(db.session, actor(), submission_id)
    resp = jsonify(status_view(row))
    resp.headers["Cache-Control"] = "no-store"
    return resp
