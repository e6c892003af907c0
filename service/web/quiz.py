"""Taking a quiz: its page (attempts, start), one item at a time or all on one page, answers
with immediate feedback, the language switch, submit, then the score and per-item review.

Nothing of the key (correct flags, feedback, explanation) is in a page before the student
answered the item: the views render ``service.core.attempts.attempt_view``, which adds it per
answered item only.
"""

from __future__ import annotations

from typing import Any

from flask import Response, redirect, request, url_for

from item_bank.model import LANGUAGES, Quiz
from service.auth import Principal
from service.core import assignments, attempts
from service.core.errors import ServiceError
from service.core.views import quiz_view
from service.db import write_intent
from service.db.attempts import IN_PROGRESS
from service.db.courses import QUIZ, Assignment
from service.extensions import db
from service.web.guard import actor, page, render
from service.web.pages import bp

VIEWS = ("one", "all")


def languages(quiz: Quiz) -> list[tuple[str, str]]:
    """The language switch: English, and the course's own wording when it is not English."""
    out = [("en", "English")]
    if quiz.source_lang != "en":
        out.append(("source", LANGUAGES.get(quiz.source_lang, quiz.source_lang)))
    return out


def _lang(default: str) -> str:
    lang = request.values.get("lang") or default
    return lang if lang in ("en", "source") else default


def landing(quiz_id: str, assignment: Assignment | None) -> Response:
    a = actor()
    quiz = attempts.load_quiz(db.session, quiz_id)
    lang = _lang(assignment.lang if assignment else "en")
    if a.is_instructor:
        return render(
            "web/quiz_preview.html",
            quiz=quiz,
            view=quiz_view(quiz, lang, with_key=True),
            assignment=assignment,
            lang=lang,
            languages=languages(quiz),
        )
    mine = attempts.my_attempts(db.session, a, quiz_id, assignment)
    limit = attempts.attempt_limit(quiz, assignment)
    open_attempt = next((x for x in mine if x.status == IN_PROGRESS), None)
    return render(
        "web/quiz.html",
        quiz=quiz,
        title=assignment.title if assignment else quiz.title.render(lang, quiz.source_lang)[1],
        description=quiz.description.render(lang, quiz.source_lang)[1],
        assignment=assignment,
        attempts=mine,
        limit=limit,
        left=None if limit is None else max(0, limit - len(mine)),
        open_attempt=open_attempt,
        lang=lang,
        languages=languages(quiz),
        due_passed=_due_passed(assignment),
    )


def _due_passed(assignment: Assignment | None) -> bool:
    from service.db.base import utcnow

    return bool(assignment and assignment.due_at and utcnow() > assignment.due_at)


@bp.get("/quiz/<quiz_id>")
@page()
def quiz_page(quiz_id: str) -> Response:
    return landing(quiz_id, None)


@bp.post("/quiz/<quiz_id>/start")
@page("student")
def start_attempt(quiz_id: str) -> Response:
    a = actor()
    with write_intent():
        db.session.rollback()
        assignment = assignments.for_target(
            db.session, a, request.form.get("assignment_id"), QUIZ, quiz_id, "form"
        )
        attempt, _quiz = attempts.start(db.session, a, quiz_id, _lang("en"), assignment)
        db.session.commit()
    return redirect(url_for("web.attempt", attempt_id=attempt.id, view=_view()), code=303)


def _view() -> str:
    v = request.values.get("view") or "one"
    return v if v in VIEWS else "one"


def _item_index(view: dict[str, Any]) -> int:
    try:
        i = int(request.values.get("item") or 0)
    except ValueError:
        i = 0
    return min(max(i, 0), len(view["items"]) - 1)


def _attempt_context(
    a: Principal, attempt_id: str, errors: dict[str, str] | None = None
) -> dict[str, Any]:
    attempt = attempts.get(db.session, a, attempt_id)
    quiz = attempts.load_quiz(db.session, attempt.quiz_id)
    lang = _lang(attempt.lang)
    view = attempts.attempt_view(
        attempt, quiz, lang=lang, allowed=attempts.allowed_for(db.session, attempt, quiz)
    )
    answered = sum(1 for it in view["items"] if it["response"] is not None)
    assignment = (
        db.session.get(Assignment, attempt.assignment_id) if attempt.assignment_id else None
    )
    return {
        "attempt": attempt,
        "quiz": quiz,
        "view": view,
        "lang": lang,
        "languages": languages(quiz),
        "mode": _view(),
        "index": _item_index(view),
        "answered": answered,
        "total": len(view["items"]),
        "assignment": assignment,
        "title": assignment.title if assignment else quiz.title.render(lang, quiz.source_lang)[1],
        "errors": errors or {},
        "taking": attempt.status == IN_PROGRESS and not a.is_instructor,
        "back_url": url_for("web.assignment", assignment_id=assignment.id)
        if assignment
        else url_for("web.quiz_page", quiz_id=quiz.id),
    }


@bp.get("/attempts/<attempt_id>")
@page()
def attempt(attempt_id: str) -> Response:
    ctx = _attempt_context(actor(), attempt_id)
    return render("web/attempt.html" if ctx["taking"] else "web/attempt_review.html", **ctx)


@bp.post("/attempts/<attempt_id>/answer")
@page("student")
def answer(attempt_id: str) -> Response:
    a = actor()
    item_id = request.form.get("item_id", "")
    chosen = request.form.getlist("answer")
    partial = request.headers.get("X-Kgrade-Partial") == "1"
    try:
        db.session.rollback()
        attempts.get(db.session, a, attempt_id)  # 404/403 before the form's own checks
        if not chosen:
            raise ServiceError(422, "choose an answer first", location="form", field="answer")
        attempts.answer(db.session, a, attempt_id, item_id, chosen)  # takes the write lock
        db.session.commit()
    except ServiceError as exc:
        db.session.rollback()
        if exc.status != 422:
            raise
        ctx = _attempt_context(a, attempt_id, errors={item_id: exc.message})
        return _item_or_page(ctx, item_id, partial, status=422)
    if partial:
        return _item_or_page(_attempt_context(a, attempt_id), item_id, True)
    anchor = f"item-{item_id}"
    return redirect(
        url_for(
            "web.attempt",
            attempt_id=attempt_id,
            item=request.form.get("item"),
            view=_view(),
            lang=_lang("en"),
            _anchor=anchor,
        ),
        code=303,
    )


def _item_or_page(ctx: dict[str, Any], item_id: str, partial: bool, status: int = 200) -> Response:
    if partial:
        items = ctx["view"]["items"]
        idx = next((i for i, it in enumerate(items) if it["id"] == item_id), ctx["index"])
        return render("web/_quiz_item.html", status=status, item=items[idx], number=idx + 1, **ctx)
    return render("web/attempt.html", status=status, **ctx)


@bp.post("/attempts/<attempt_id>/submit")
@page("student")
def submit_attempt(attempt_id: str) -> Response:
    a = actor()
    with write_intent():
        db.session.rollback()
        attempts.submit(db.session, a, attempt_id)
        db.session.commit()
    return redirect(url_for("web.attempt", attempt_id=attempt_id, lang=_lang("en")), code=303)
