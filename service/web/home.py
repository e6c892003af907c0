"""Signing in and out, entering from an LMS launch, and the course page."""

from __future__ import annotations

import hmac
import secrets

from flask import Response, g, redirect, request, url_for

from service.auth import authenticate
from service.core import assignments, grades
from service.db import write_intent
from service.db.courses import EXERCISE, QUIZ, Course
from service.extensions import db, rate_limits
from service.web import session as web_session
from service.web.guard import actor, error_page, page, render, same_origin
from service.web.pages import bp


def _local_path(target: str | None, default: str) -> str:
    """Only a path on this site (no scheme, no host): never an open redirect."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    return target


#: Sign-in has no session yet to tie a CSRF token to: the form's token must equal this cookie's
#: (double submit), so another site cannot sign a visitor in under its own token.
SIGNIN_COOKIE = "kgrade_signin"


def signin_page(next_url: str, error: str | None = None, status: int = 200) -> Response:
    token = secrets.token_urlsafe(24)
    resp = render(
        "web/signin.html", status=status, next_url=next_url, error=error, signin_token=token
    )
    resp.set_cookie(
        SIGNIN_COOKIE, token, max_age=3600, path="/signin", **web_session.cookie_kwargs(request)
    )
    return resp


@bp.route("/signin", methods=["GET", "POST"])
@rate_limits.limited("signin")  # failed sign-ins per address (KGRADE_SIGNIN_RATE); 429 is a page
def signin() -> Response:
    """Stand-alone sign-in with an API token (``kgrade token create``)."""
    next_url = _local_path(request.values.get("next"), url_for("web.home"))
    if request.method == "GET":
        return signin_page(next_url)
    expected = request.cookies.get(SIGNIN_COOKIE, "")
    sent = request.form.get("signin_token", "")
    if not same_origin() or not expected or not hmac.compare_digest(expected, sent):
        return signin_page(
            next_url,
            "This sign-in form expired or came from another site; sign in again.",
            status=400,
        )
    token = (request.form.get("token") or "").strip()
    with write_intent():
        db.session.rollback()
        who = authenticate(db.session, token) if token else None
        if who is None:
            return signin_page(
                next_url,
                "That token is not valid (or was revoked). Ask your instructor for one, "
                "or make one with `kgrade token create`.",
                status=401,
            )
        started = web_session.start(
            db.session,
            user_id=who.user_id,
            course_id=who.course_id,
            role=who.role,
            token_id=who.token_id,
        )
        db.session.commit()
    resp = redirect(next_url, code=303)
    web_session.set_cookie(resp, started.token)
    resp.delete_cookie(SIGNIN_COOKIE, path="/signin")
    return resp


@bp.post("/signout")
@page()
def signout() -> Response:
    with write_intent():
        web_session.end(db.session, g.web_token)
        db.session.commit()
    g.kgs_in_url = None
    resp = redirect(url_for("web.signin"), code=303)
    web_session.clear_cookie(resp)
    return resp


@bp.get("/enter")
def enter() -> Response:
    """A launch's hand-over: our own request, so the cookie tells whether it will stick."""
    next_url = _local_path(request.args.get("next"), url_for("web.home"))
    with write_intent():
        db.session.rollback()
        row = web_session.redeem_ticket(db.session, request.args.get("ticket", ""))
        if row is None:
            return error_page(
                400,
                "This link was already used or has expired. Open kgrade again from your course.",
            )
        if web_session.holds(row, request.cookies.get(web_session.COOKIE)):
            db.session.commit()
            return redirect(next_url, code=303)
        # The browser refused our cookie (a third-party frame with cookies blocked): the
        # session rides in the URL from here on.
        token = web_session.reissue(db.session, row)
        db.session.commit()
    sep = "&" if "?" in next_url else "?"
    return redirect(f"{next_url}{sep}{web_session.URL_PARAM}={token}", code=303)


@bp.get("/")
def home() -> Response:
    if g.get("actor") is None:
        return redirect(url_for("web.signin"), code=302)
    return course_page()


@page()
def course_page() -> Response:
    a = actor()
    items = assignments.for_course(db.session, a.course_id)
    rows = []
    for x in items:
        mine = grades.summaries(db.session, x, [a.user_id]).get(a.user_id)
        rows.append(
            {
                "assignment": x,
                "graded": len(mine.graded) if mine else 0,
                "grade": mine.grade(x.policy) if mine else None,
                "in_progress": mine.in_progress if mine else 0,
            }
        )
    course = db.session.get(Course, a.course_id)
    catalogue = []
    # An LMS course's students see what the instructor placed; a stand-alone course's see the
    # whole catalogue too.
    if a.is_instructor or (course is not None and not course.is_lti):
        catalogue = assignments.catalogue(db.session)
    return render(
        "web/home.html",
        rows=rows,
        catalogue=catalogue,
        quizzes=[c for c in catalogue if c.kind == QUIZ],
        exercises=[c for c in catalogue if c.kind == EXERCISE],
        notice=request.args.get("notice"),
    )


@bp.get("/a/<assignment_id>")
@page()
def assignment(assignment_id: str) -> Response:
    from service.web import exercise, instructor, quiz

    a = actor()
    x = assignments.get(db.session, a, assignment_id)
    if a.is_instructor:
        return instructor.assignment_page(x)
    if x.kind == QUIZ:
        return quiz.landing(x.resource_id, x)
    return exercise.exercise_page(x.resource_id, x)


@bp.get("/licenses")
def licenses() -> Response:
    import json
    from pathlib import Path

    manifest = Path(__file__).resolve().parents[1] / "static" / "vendor" / "manifest.json"
    packages = json.loads(manifest.read_text()) if manifest.is_file() else []
    return render("web/licenses.html", packages=packages)
