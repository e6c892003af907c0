"""Instructors: the course's assignments and roster, an assignment's grade table (best, last,
submitted or not, passback state) with CSV, one student's work, regrading, re-sending grades
to the LMS, the LMS export buttons, and the exercises' known solutions."""

from __future__ import annotations

from typing import Any

from flask import Response, current_app, redirect, request, url_for
from sqlalchemy import select

from service.core import assignments, attempts, grades, people, submissions
from service.core.errors import ServiceError, not_found
from service.core.tasks import QUEUE_LTI, ROSTER_TASK, enqueue_after_commit
from service.db import write_intent
from service.db.attempts import Attempt
from service.db.courses import QUIZ, Assignment, Course, User
from service.extensions import db
from service.web.guard import actor, page, render
from service.web.pages import bp

#: The LMS export buttons: format and what it is for (as the README's table says).
EXPORT_LABELS = {
    "qti12": "Canvas (QTI 1.2)",
    "moodle-mbz": "Moodle quiz, graded right (Moodle backup .mbz)",
    "moodle-xml": "Moodle question bank (Moodle XML)",
    "qti21": "QTI 2.1 package",
    # Moodle's cartridge converter sets every mark to 1 (docs/moodle.md): for other LMSs
    "imscc": "Common Cartridge (not for Moodle quizzes: marks come out wrong)",
}

GRADE_COLUMNS = [
    "student",
    "email",
    "roster_status",
    "submitted",
    "graded",
    "in_progress",
    "best_score",
    "last_score",
    "last_at",
    "grade",
    "score_maximum",
    "passback_status",
    "passback_error",
]


def _course() -> Course:
    course = db.session.get(Course, actor().course_id)
    assert course is not None
    return course


def assignment_page(x: Assignment, **extra: Any) -> Response:
    rows = grades.assignment_table(db.session, x)
    formats: list[tuple[str, str]] = []
    if x.kind == QUIZ:
        formats = list(EXPORT_LABELS.items())
    return render(
        "web/assignment_admin.html",
        x=x,
        rows=rows,
        submitted=sum(1 for r in rows if r["submitted"]),
        failed=sum(1 for r in rows if r["passback_status"] == "failed"),
        formats=formats,
        **extra,
    )


@bp.get("/a/<assignment_id>/grades.csv")
@page("instructor")
def grades_csv(assignment_id: str) -> Response:
    x = assignments.get(db.session, actor(), assignment_id)
    body = grades.to_csv(GRADE_COLUMNS, grades.assignment_table(db.session, x))
    return Response(
        body,
        mimetype="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{x.resource_id}-grades.csv"'},
    )


@bp.post("/a/<assignment_id>/resend")
@page("instructor")
def resend(assignment_id: str) -> Response:
    """Send every student's current grade to the LMS again (after fixing what it refused)."""
    with write_intent():
        db.session.rollback()
        x = assignments.get(db.session, actor(), assignment_id)
        n = grades.resend(db.session, x)
        db.session.commit()
    return redirect(url_for("web.assignment", assignment_id=assignment_id, resent=n), code=303)


@bp.post("/a/<assignment_id>/settings")
@page("instructor")
def settings(assignment_id: str) -> Response:
    with write_intent():
        db.session.rollback()
        x = assignments.get(db.session, actor(), assignment_id)
        spec = assignments.parse_spec(
            db.session, {**request.form.to_dict(), "resource": f"{x.kind}:{x.resource_id}"}
        )
        x.title, x.lang, x.allowed_attempts = spec.title, spec.lang, spec.allowed_attempts
        x.policy, x.due_at = spec.policy, spec.due_at
        db.session.commit()
    return redirect(url_for("web.assignment", assignment_id=assignment_id, saved=1), code=303)


@bp.get("/a/<assignment_id>/students/<row_id:user_id>")
@page("instructor")
def student_work(assignment_id: str, user_id: int) -> Response:
    a = actor()
    x = assignments.get(db.session, a, assignment_id)
    user = db.session.get(User, user_id)
    if user is None:
        raise not_found("user_id", f"unknown student {user_id}")
    if x.kind == QUIZ:
        work = list(
            db.session.execute(
                select(Attempt)
                .where(Attempt.assignment_id == x.id, Attempt.user_id == user_id)
                .order_by(Attempt.number)
            ).scalars()
        )
    else:
        work = submissions.history(db.session, a, x.resource_id, x, user_id=user_id)
    summary = grades.summaries(db.session, x, [user_id]).get(user_id)
    passbacks = grades.latest_passbacks(db.session, x.id)
    return render(
        "web/student_work.html",
        x=x,
        student=user,
        work=work,
        summary=summary,
        grade=summary.grade(x.policy) if summary else None,
        passback=passbacks.get(user_id),
    )


@bp.get("/course")
@page("instructor")
def course_admin() -> Response:
    course = _course()
    return render(
        "web/course_admin.html",
        assignments=assignments.for_course(db.session, course.id),
        roster=people.members(db.session, course.id),
        catalogue=assignments.catalogue(db.session),
        form={},
    )


@bp.post("/course/assignments")
@page("instructor")
def create_assignment() -> Response:
    a = actor()
    try:
        with write_intent():
            db.session.rollback()
            spec = assignments.parse_spec(db.session, request.form.to_dict())
            x = assignments.create(db.session, a.course_id, spec, a.user_id)
            db.session.commit()
    except ServiceError as exc:
        db.session.rollback()
        if exc.status != 422:
            raise
        course = _course()
        return render(
            "web/course_admin.html",
            status=422,
            assignments=assignments.for_course(db.session, course.id),
            roster=people.members(db.session, course.id),
            catalogue=assignments.catalogue(db.session),
            form=request.form,
            error=exc,
        )
    return redirect(url_for("web.assignment", assignment_id=x.id), code=303)


@bp.post("/course/roster")
@page("instructor")
def refresh_roster() -> Response:
    """Read the course's members from the LMS (Names and Role Provisioning) again."""
    course = _course()
    if not course.nrps_url:
        raise ServiceError(409, "this course's LMS gave no roster service (NRPS) at launch")
    with write_intent():
        db.session.rollback()
        enqueue_after_commit(db.session, ROSTER_TASK, [course.id], QUEUE_LTI)
        db.session.commit()
    return redirect(request.form.get("back") or url_for("web.course_admin"), code=303)


@bp.post("/quiz/<quiz_id>/regrade")
@page("instructor")
def regrade_quiz(quiz_id: str) -> Response:
    """Re-score the course's submitted attempts against the quiz's current key."""
    a = actor()
    with write_intent():
        db.session.rollback()
        quiz = attempts.load_quiz(db.session, quiz_id)
        report = grades.regrade(db.session, a.course_id, quiz, dry_run=False)
        db.session.commit()
    back = request.form.get("assignment_id")
    if back:
        x = assignments.get(db.session, a, back)
        return assignment_page(x, regrade=report)
    return redirect(url_for("web.quiz_page", quiz_id=quiz_id), code=303)


@bp.post("/submissions/<row_id:submission_id>/regrade")
@page("instructor")
def regrade_submission(submission_id: int) -> Response:
    """Grade the same source again, for the same student (it counts like their own)."""
    a = actor()
    with write_intent():
        db.session.rollback()
        row = submissions.get(db.session, a, submission_id)
        created = submissions.regrade(db.session, a, row, current_app.config)
        db.session.commit()
    return redirect(url_for("web.submission", submission_id=created["id"]), code=303)


@bp.get("/quiz/<quiz_id>/export")
@page("instructor")
def export_quiz(quiz_id: str) -> Response:
    from service.exports import export_quiz as export

    quiz = attempts.load_quiz(db.session, quiz_id)
    try:
        result = export(quiz, request.args.get("format", ""), request.args.get("lang", "en"))
    except ValueError as exc:
        raise ServiceError(422, str(exc), location="query", field="format") from None
    return Response(
        result.data,
        mimetype=result.media_type,
        headers={"Content-Disposition": f'attachment; filename="{result.filename}"'},
    )


@bp.get("/exercise/<exercise_id>/solutions")
@page("instructor")
def solutions(exercise_id: str) -> Response:
    ex = submissions.exercise(exercise_id)
    return render(
        "web/solutions.html",
        ex=ex,
        rows=submissions.known_solutions(db.session, actor(), ex),
    )


@bp.post("/exercise/<exercise_id>/solutions")
@page("instructor")
def grade_solutions(exercise_id: str) -> Response:
    """Grade one known solution (``name``) or all of them, as the instructor."""
    a = actor()
    ex = submissions.exercise(exercise_id)
    wanted = request.form.get("name")
    picked = [s for s in ex.solutions() if wanted in (None, "", s.name)]
    if not picked:
        raise not_found("name", f"no known solution {wanted!r}", location="form")
    with write_intent():
        db.session.rollback()
        ids = [
            submissions.create(db.session, a, ex, s.source(), s.name + ".py", current_app.config)[
                "id"
            ]
            for s in picked
        ]
        db.session.commit()
    if len(ids) == 1:
        return redirect(url_for("web.submission", submission_id=ids[0]), code=303)
    return redirect(url_for("web.solutions", exercise_id=exercise_id), code=303)
