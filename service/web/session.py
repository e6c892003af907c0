"""Who is signed in to the pages, and how the browser carries it.

A session is a random token whose SHA-256 is a ``web_sessions`` row. The browser carries it in
the ``kgrade_session`` cookie; inside an LMS iframe whose browser refuses our cookie (third-party
cookies blocked, partitioned ones too) it is carried in the URL instead (``kgs``), and every
link and form the pages make carries it on. A launch, a cross-site POST, hands over by a
one-time ticket: the next request, our own, tells whether the cookie arrived.

CSRF: every form and every state-changing request carries ``csrf_token``, an HMAC of the
session token, so only a page we served to this session can post.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from flask import Flask, Request, Response, g, request
from flask.sessions import SecureCookieSessionInterface, SessionMixin
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.auth import Principal
from service.db.base import utcnow
from service.db.courses import Course, User
from service.db.web import WebSession

COOKIE = "kgrade_session"
URL_PARAM = "kgs"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
#: How long a session lasts (a working day and then some).
LIFETIME = timedelta(hours=12)
#: How long the launch's hand-over ticket may wait for its redirect.
TICKET_LIFETIME = timedelta(seconds=120)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Started:
    token: str
    ticket: str


def start(
    session: Session,
    *,
    user_id: int,
    course_id: int,
    role: str,
    launch_id: str | None = None,
    token_id: int | None = None,
) -> Started:
    """A new session (its row flushed); the caller commits and hands ``token`` to the browser
    (cookie) and ``ticket`` to its next request."""
    token = secrets.token_urlsafe(32)
    ticket = secrets.token_urlsafe(24)
    now = utcnow()
    # Expired sessions go as new ones come: no sweeper needed.
    session.execute(delete(WebSession).where(WebSession.expires_at < now))
    session.add(
        WebSession(
            token_hash=_hash(token),
            ticket_hash=_hash(ticket),
            ticket_expires_at=now + TICKET_LIFETIME,
            user_id=user_id,
            course_id=course_id,
            role=role,
            token_id=token_id,
            launch_id=launch_id,
            created_at=now,
            expires_at=now + LIFETIME,
        )
    )
    session.flush()
    return Started(token, ticket)


def redeem_ticket(session: Session, ticket: str) -> WebSession | None:
    """The session a ticket hands over, once: the ticket is spent."""
    if not ticket or len(ticket) > 100:
        return None
    row = session.execute(
        select(WebSession).where(WebSession.ticket_hash == _hash(ticket))
    ).scalar_one_or_none()
    if row is None or row.ticket_expires_at is None or row.ticket_expires_at < utcnow():
        return None
    row.ticket_hash = None
    row.ticket_expires_at = None
    return row


def holds(row: WebSession, token: str | None) -> bool:
    """Whether ``token`` (say, the cookie that came with a request) is ``row``'s."""
    return bool(token) and hmac.compare_digest(row.token_hash, _hash(token or ""))


def reissue(session: Session, row: WebSession) -> str:
    """A fresh token for ``row``, to carry in the URL when the cookie was refused (the first
    one was only ever in that cookie)."""
    token = secrets.token_urlsafe(32)
    row.token_hash = _hash(token)
    session.flush()
    return token


def end(session: Session, token: str) -> None:
    session.execute(delete(WebSession).where(WebSession.token_hash == _hash(token)))


def presented_token(req: Request) -> tuple[str | None, bool]:
    """The session token this request carries, and whether it came in the URL or a form."""
    carried = req.args.get(URL_PARAM) or (req.form.get(URL_PARAM) if req.method == "POST" else None)
    if carried:
        return carried, True
    return req.cookies.get(COOKIE), False


def load(session: Session, token: str | None) -> tuple[WebSession, Principal] | None:
    if not token or len(token) > 100:
        return None
    row = session.execute(
        select(WebSession).where(WebSession.token_hash == _hash(token))
    ).scalar_one_or_none()
    if row is None or row.expires_at < utcnow():
        return None
    user = session.get(User, row.user_id)
    if user is None or session.get(Course, row.course_id) is None:
        return None
    if row.token_id is not None:
        from service.db.tokens import ApiToken

        api_token = session.get(ApiToken, row.token_id)
        if api_token is None or api_token.revoked:
            return None  # signing out everywhere is revoking the token
    principal = Principal(
        token_id=row.token_id,
        name=user.name,
        role=row.role,
        user_id=row.user_id,
        course_id=row.course_id,
    )
    return row, principal


def csrf_token(token: str) -> str:
    return hmac.new(token.encode(), b"kgrade-csrf", hashlib.sha256).hexdigest()


def csrf_ok(token: str, req: Request) -> bool:
    sent = req.form.get(CSRF_FIELD) or req.headers.get(CSRF_HEADER) or ""
    return hmac.compare_digest(sent, csrf_token(token))


def cookie_kwargs(req: Request) -> dict[str, object]:
    """Cookie attributes: inside an LMS iframe over TLS the cookie is third-party, so it must be
    ``SameSite=None; Secure`` and ``Partitioned`` (CHIPS: browsers that block third-party
    cookies still keep a partitioned one per embedding site). Over plain HTTP (a laptop)
    ``SameSite=Lax``."""
    if req.is_secure:
        return {"secure": True, "samesite": "None", "partitioned": True, "httponly": True}
    return {"secure": False, "samesite": "Lax", "httponly": True}


def set_cookie(resp: Response, token: str) -> None:
    resp.set_cookie(
        COOKIE, token, max_age=int(LIFETIME.total_seconds()), path="/", **cookie_kwargs(request)
    )


def clear_cookie(resp: Response) -> None:
    resp.delete_cookie(COOKIE, path="/", **cookie_kwargs(request))


class FlaskCookieSessions(SecureCookieSessionInterface):
    """Flask's own signed-cookie session (``flask.session``; the pages sign in with the cookie
    above), without a signing serializer built for a request that carries no such cookie, as
    every API call does: building it was a fortieth of a quiz answer's CPU, for an empty
    session. A request with the cookie, and an app without a secret key, go as before."""

    def open_session(self, app: Flask, request: Request) -> SessionMixin | None:
        # WSGI keeps the Cookie header under one key; request.cookies would walk every header
        cookies = "HTTP_COOKIE" in request.environ
        if app.secret_key and not (cookies and request.cookies.get(self.get_cookie_name(app))):
            return self.session_class()
        return super().open_session(app, request)


def init_app(app: Flask) -> None:
    """Links and redirects keep the session in the URL when that is how it came."""
    app.session_interface = FlaskCookieSessions()

    @app.url_defaults
    def _carry(endpoint: str, values: dict[str, object]) -> None:
        token = g.get("kgs_in_url")
        if token and not endpoint.startswith(("static", "api", "docs")) and endpoint != "lti.jwks":
            values.setdefault(URL_PARAM, token)


def in_url() -> bool:
    return bool(g.get("kgs_in_url"))
