"""The LTI endpoints: OIDC login, launch, JWKS, deep linking, and binding a bare link.

Thin views over ``service.lti.launch`` (validation), ``service.lti.context`` (what a launch
means) and ``service.lti.deep_linking``. Every refusal is a 400 page (JSON for a client that
asks for it) that names the problem, never a 500.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit

from flask import Blueprint, Response, current_app, g, jsonify, redirect, request, url_for
from sqlalchemy.exc import SQLAlchemyError

from service.core import assignments
from service.core.errors import ServiceError
from service.core.tasks import QUEUE_LTI, ROSTER_TASK, enqueue_after_commit
from service.db import write_intent
from service.db.base import utcnow
from service.db.courses import Assignment
from service.db.lti import LtiLaunch, LtiPlatform
from service.extensions import db
from service.lti import context, deep_linking, keys
from service.lti.launch import (
    CookieRefused,
    LaunchError,
    begin_login,
    validate_launch,
)
from service.web import session as web_session
from service.web.guard import error_page, load_actor, page, render

bp = Blueprint("lti", __name__, url_prefix="/lti")
bp.before_request(load_actor)


def launch_url() -> str:
    base = current_app.config.get("BASE_URL")
    return f"{base.rstrip('/')}/lti/launch" if base else url_for("lti.launch", _external=True)


def tool_host() -> str:
    base = current_app.config.get("BASE_URL")
    return urlsplit(base).netloc if base else request.host


def _params() -> dict[str, str]:
    merged = dict(request.args.items())
    if request.method == "POST":
        merged.update(request.form.items())
    return merged


def lti_error(message: str, status: int = 400, **ctx: Any) -> Response:
    db.session.rollback()
    return error_page(status, message, title="kgrade could not open", **ctx)


@bp.get("/jwks")
def jwks() -> Response:
    """Our public keys (the signing key and retired ones in their grace period)."""
    published = keys.published(db.session)
    if not any(k.retired_at is None for k in published):
        with write_intent():  # first use: make the signing key
            db.session.rollback()
            keys.active(db.session)
            db.session.commit()
        published = keys.published(db.session)
    resp = jsonify({"keys": [keys.public_jwk(k) for k in published]})
    resp.headers["Cache-Control"] = "public, max-age=300"
    return resp


@bp.route("/login", methods=["GET", "POST"])
def login() -> Response:
    """OIDC login initiation: record state and nonce, send the browser to the platform."""
    params = _params()
    try:
        with write_intent():
            db.session.rollback()
            started = begin_login(
                db.session,
                params,
                launch_url=launch_url(),
                tool_host=tool_host(),
                is_secure=request.is_secure,
                cookies=dict(request.cookies),
            )
            db.session.commit()
    except LaunchError as exc:
        return lti_error(str(exc))
    if started.storage_target:
        # The platform keeps state and nonce for us (LTI Platform Storage): a page whose
        # script stores them through postMessage, then goes on to the platform.
        resp = render(
            "lti/storage_login.html",
            auth_url=started.redirect_url,
            target=started.storage_target,
            origin=_origin(started.platform.auth_login_url),
            state=started.state,
            nonce=started.nonce,
        )
    else:
        resp = redirect(started.redirect_url, code=302)
    started.cookies.update_response(resp)
    return resp


@bp.post("/launch")
def launch() -> Response:
    params = _params()
    try:
        with write_intent():
            db.session.rollback()
            checked = validate_launch(
                db.session, params, is_secure=request.is_secure, cookies=dict(request.cookies)
            )
            arrival = context.arrive(db.session, checked)
            started = web_session.start(
                db.session,
                user_id=arrival.user.id,
                course_id=arrival.course.id,
                role=arrival.role,
                launch_id=arrival.launch.id,
            )
            target = _landing(arrival)
            _refresh_roster(arrival)
            db.session.commit()
    except CookieRefused as exc:
        db.session.rollback()
        if exc.login.storage_target and params.get("lti_storage_checked") != "1":
            platform = db.session.get(LtiPlatform, exc.login.platform_id)
            return render(
                "lti/storage_launch.html",
                target=exc.login.storage_target,
                origin=_origin(platform.auth_login_url) if platform else "",
                id_token=params.get("id_token", ""),
                state=params.get("state", ""),
                new_window=_new_window_url(exc.login.params),
            )
        return lti_error(str(exc), new_window=_new_window_url(exc.login.params))
    except LaunchError as exc:
        return lti_error(str(exc))
    except SQLAlchemyError:
        current_app.logger.exception("launch failed on the database")
        return lti_error("kgrade could not record this launch; try again", status=503)
    resp = redirect(url_for("web.enter", ticket=started.ticket, next=target), code=303)
    web_session.set_cookie(resp, started.token)
    return resp


#: An instructor's launch reads the roster again when it is older than this.
ROSTER_STALE = timedelta(minutes=10)


def _refresh_roster(a: context.Arrival) -> None:
    """On an instructor's launch, read the course's roster (NRPS) again if it is stale, so
    the grade table lists who has not submitted."""
    synced = a.course.roster_synced_at
    if a.role != "instructor" or not a.course.nrps_url:
        return
    if synced is not None and synced > utcnow() - ROSTER_STALE and not a.course.roster_error:
        return
    enqueue_after_commit(db.session, ROSTER_TASK, [a.course.id], QUEUE_LTI)


def _landing(a: context.Arrival) -> str:
    if a.page == "deep_link":
        return url_for("lti.deep_link", launch_id=a.launch.id)
    if a.page == "setup":
        return url_for("lti.setup", launch_id=a.launch.id)
    if a.page == "unset" or a.assignment is None:
        return url_for("web.home", notice="unset")
    if a.page == "review" and a.role == "instructor" and a.for_user is not None:
        return url_for("web.student_work", assignment_id=a.assignment.id, user_id=a.for_user.id)
    return url_for("web.assignment", assignment_id=a.assignment.id)


def _origin(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}"


def _new_window_url(login_params: dict[str, Any]) -> str:
    """The login again, in a window of its own: there our cookie is first-party."""
    query = {k: v for k, v in (login_params or {}).items() if isinstance(v, str)}
    query["lti1p3_new_window"] = "1"
    return url_for("lti.login") + "?" + urlencode(query)


def _launch_for(launch_id: str, kind: str) -> LtiLaunch:
    row = context.launch_row(db.session, launch_id)
    web = g.get("web_row")
    if row is None or web is None or web.launch_id != row.id or row.message_type != kind:
        raise ServiceError(404, "this launch is not yours or has expired; launch again")
    return row


@bp.route("/deep-link/<launch_id>", methods=["GET", "POST"])
@page("instructor")
def deep_link(launch_id: str) -> Response:
    """The instructor picks what to place in the course; the platform gets it signed."""
    row = _launch_for(launch_id, "LtiDeepLinkingRequest")
    settings = row.claims.get("deep_linking_settings") or {}
    if request.method == "GET":
        return _picker("deep_link", launch_id, settings.get("title"))
    items: list[Assignment] = []
    if request.form.get("action") != "cancel":
        try:
            with write_intent():
                db.session.rollback()
                spec = assignments.parse_spec(db.session, request.form.to_dict())
                items.append(assignments.create(db.session, row.course_id or 0, spec, row.user_id))
                db.session.commit()
        except ServiceError as exc:
            return _picker("deep_link", launch_id, settings.get("title"), exc)
    platform = db.session.get(LtiPlatform, row.platform_id)
    assert platform is not None
    answer = deep_linking.respond(db.session, row, platform, items, launch_url())
    return render(
        "lti/deep_link_return.html", return_url=answer.return_url, jwt=answer.jwt, items=items
    )


def _picker(
    mode: str, launch_id: str, title: str | None, error: ServiceError | None = None
) -> Response:
    """The assignment picker; after a refused pick, again with the message and what was typed."""
    db.session.rollback()
    return render(
        "lti/picker.html",
        status=error.status if error else 200,
        mode=mode,
        action=url_for(
            "lti.deep_link" if mode == "deep_link" else "lti.setup", launch_id=launch_id
        ),
        catalogue=assignments.catalogue(db.session),
        title_hint=title or "",
        form=request.form if error else {},
        error=error,
    )


@bp.route("/setup/<launch_id>", methods=["GET", "POST"])
@page("instructor")
def setup(launch_id: str) -> Response:
    """A link the LMS made without deep linking: the instructor says what it delivers."""
    row = _launch_for(launch_id, "LtiResourceLinkRequest")
    title = (row.claims.get("resource_link") or {}).get("title")
    if request.method == "GET":
        return _picker("setup", launch_id, title)
    try:
        with write_intent():
            db.session.rollback()
            spec = assignments.parse_spec(db.session, request.form.to_dict())
            a = assignments.create(db.session, row.course_id or 0, spec, row.user_id)
            a.resource_link_id = row.resource_link_id
            ags = row.claims.get("ags") or {}
            if ags.get("lineitem"):
                a.lineitem_url = str(ags["lineitem"])
            db.session.commit()
    except ServiceError as exc:
        return _picker("setup", launch_id, title, exc)
    return redirect(url_for("web.assignment", assignment_id=a.id), code=303)


@bp.get("/canvas.json")
def canvas_json() -> Response:
    """The Canvas developer-key JSON for this tool (Canvas: "Enter URL")."""
    from service.lti.config import canvas_key

    base = current_app.config.get("BASE_URL") or request.host_url
    return jsonify(canvas_key(base))
