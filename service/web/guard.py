"""Who may see a page, CSRF on every form, and rendering with the common context.

``page(*roles)`` wraps a view: no session sends the browser to the sign-in page (or, inside an
LMS, says to launch again); a role outside ``roles`` is a 403 page; a POST must carry the
session's CSRF token and come from our own origin. Service-layer refusals render as an error
page with their status, never a 500.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlsplit

from flask import Response, g, redirect, render_template, request, url_for

from service.auth import Principal
from service.core.errors import ServiceError
from service.db.courses import Course
from service.extensions import db
from service.web import session as web_session

F = TypeVar("F", bound=Callable[..., Any])

ROLES = ("instructor", "student")


def load_actor() -> None:
    """Before every page request: the session this request carries, if any."""
    g.actor = None
    token, in_url = web_session.presented_token(request)
    loaded = web_session.load(db.session, token)
    if loaded is None:
        return
    g.web_row, g.actor = loaded
    g.web_token = token
    if in_url:
        g.kgs_in_url = token


def actor() -> Principal:
    a: Principal | None = g.get("actor")
    if a is None:  # a view reached without @page is a programming error
        raise RuntimeError("no signed-in actor in this request")
    return a


def same_origin() -> bool:
    """A POST from a page of ours: its Origin (or Referer) is this host. Browsers send Origin
    on every cross-site POST, so a missing one is a same-origin or non-browser client."""
    origin = request.headers.get("Origin") or request.headers.get("Referer")
    if origin is None:
        return True
    return urlsplit(origin).netloc.lower() == request.host.lower()


def page(*roles: str) -> Callable[[F], F]:
    allowed = roles or ROLES

    def decorator(func: F) -> F:
        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            a = g.get("actor")
            if a is None:
                if request.method == "GET" and not g.get("kgs_in_url"):
                    return redirect(url_for("web.signin", next=request.full_path.rstrip("?")))
                return error_page(
                    401, "Your session ended. Open kgrade again from your course, or sign in."
                )
            if a.role not in allowed:
                return error_page(403, f"This page is for {' and '.join(allowed)}s.")
            if request.method == "POST":
                if not same_origin():
                    return error_page(403, "This form was posted from another site.")
                if not web_session.csrf_ok(g.web_token, request):
                    return error_page(
                        400,
                        "This form has expired (its security token does not match). "
                        "Reload the page and try again.",
                    )
            try:
                return func(*args, **kwargs)
            except ServiceError as exc:
                db.session.rollback()
                return error_page(exc.status, exc.message, headers=exc.headers, field=exc.field)

        return wrapper  # type: ignore[return-value]

    return decorator


def url_with(**changes: Any) -> str:
    """This page's URL with some query parameters changed (the language switch, paging)."""
    args = {**request.args.to_dict(), **{k: v for k, v in changes.items() if v is not None}}
    args.pop(web_session.URL_PARAM, None)  # url_defaults puts it back when it rides in the URL
    return url_for(request.endpoint or "web.home", **(request.view_args or {}), **args)


def render(template: str, status: int = 200, **ctx: Any) -> Response:
    a: Principal | None = g.get("actor")
    course = db.session.get(Course, a.course_id) if a is not None else None
    token = g.get("web_token")
    html = render_template(
        template,
        actor=a,
        course=course,
        csrf_token=web_session.csrf_token(token) if token else "",
        kgs=g.get("kgs_in_url"),
        url_with=url_with,
        **ctx,
    )
    return Response(html, status=status, mimetype="text/html")


def error_page(
    status: int,
    message: str,
    *,
    headers: dict[str, str] | None = None,
    field: str | None = None,
    **ctx: Any,
) -> Response:
    if request.accept_mimetypes.best == "application/json":
        from flask import jsonify

        resp = jsonify(
            {
                "code": status,
                "status": _status_name(status),
                "message": f"{field}: {message}" if field else message,
            }
        )
        resp.status_code = status
    else:
        resp = render(
            "web/error.html", status=status, status_code=status, message=message, field=field, **ctx
        )
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def _status_name(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
