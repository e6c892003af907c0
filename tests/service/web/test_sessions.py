"""Sessions of the pages without a browser: sign-in by token (with its CSRF guard), every form's
CSRF token, another site's posts refused, revoked tokens ending sessions, a session in the URL,
and the pages' security headers."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask.testing import FlaskClient

from service.auth import revoke_token
from service.db import write_intent
from service.extensions import db
from tests.service.conftest import World


def _signin(client: FlaskClient, token: str) -> Any:
    page = client.get("/signin").get_data(as_text=True)
    form_token = re.search(r'name="signin_token" value="([^"]+)"', page).group(1)
    return client.post("/signin", data={"token": token, "signin_token": form_token})


def _csrf(html: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def test_sign_in_with_a_token_and_out(world: World) -> None:
    c = world.app.test_client()
    assert c.get("/").status_code == 302  # to the sign-in page
    r = _signin(c, world.tokens["alice"])
    assert r.status_code == 303 and r.headers["Location"] == "/"
    cookie = next(h for h in r.headers.getlist("Set-Cookie") if h.startswith("kgrade_session="))
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie  # plain HTTP: a first-party cookie
    home = c.get("/")
    assert home.status_code == 200 and "alice (student)" in home.get_data(as_text=True)
    r = c.post("/signout", data={"csrf_token": _csrf(home.get_data(as_text=True))})
    assert r.status_code == 303
    assert c.get("/").status_code == 302


def test_sign_in_refuses_bad_tokens_and_forged_forms(world: World) -> None:
    c = world.app.test_client()
    r = _signin(c, "kg_not-a-token")
    assert r.status_code == 401 and "not valid" in r.get_data(as_text=True)
    # A form posted without the token its page carried (another site signing a visitor in).
    r = c.post("/signin", data={"token": world.tokens["alice"]})
    assert r.status_code == 400 and "expired or came from another site" in r.get_data(as_text=True)
    c2 = world.app.test_client()
    page = c2.get("/signin").get_data(as_text=True)
    form_token = re.search(r'name="signin_token" value="([^"]+)"', page).group(1)
    r = c2.post(
        "/signin",
        data={"token": world.tokens["alice"], "signin_token": form_token},
        headers={"Origin": "https://evil.example"},
    )
    assert r.status_code == 400


def test_every_form_needs_its_csrf_token(world: World) -> None:
    c = world.app.test_client()
    _signin(c, world.tokens["alice"])
    page = c.get("/quiz/quiz-a").get_data(as_text=True)
    assert c.post("/quiz/quiz-a/start", data={}).status_code == 400
    assert c.post("/quiz/quiz-a/start", data={"csrf_token": "0" * 64}).status_code == 400
    forged = c.post(
        "/quiz/quiz-a/start",
        data={"csrf_token": _csrf(page)},
        headers={"Origin": "https://evil.example"},
    )
    assert forged.status_code == 403
    ok = c.post("/quiz/quiz-a/start", data={"csrf_token": _csrf(page)})
    assert ok.status_code == 303


def test_revoking_the_token_ends_its_sessions(world: World) -> None:
    c = world.app.test_client()
    _signin(c, world.tokens["bob"])
    assert c.get("/").status_code == 200
    with world.app.app_context(), write_intent():
        from sqlalchemy import select

        from service.db.tokens import ApiToken

        token_id = db.session.execute(select(ApiToken.id).where(ApiToken.name == "bob")).scalar()
        revoke_token(db.session, token_id)
        db.session.commit()
    assert c.get("/").status_code == 302


def test_a_session_in_the_url_rides_on_links_and_forms(world: World) -> None:
    """What a browser that refuses the cookie gets: the session in the URL, carried on."""
    c = world.app.test_client()
    _signin(c, world.tokens["alice"])
    token = c.get_cookie("kgrade_session").value
    bare = world.app.test_client()  # no cookie at all
    page = bare.get(f"/quiz/quiz-a?kgs={token}").get_data(as_text=True)
    assert f'name="kgs" value="{token}"' in page  # forms carry it
    assert f"/?kgs={token}" in page  # links carry it
    r = bare.post("/quiz/quiz-a/start", data={"csrf_token": _csrf(page), "kgs": token})
    assert r.status_code == 303 and f"kgs={token}" in r.headers["Location"]
    assert bare.get("/quiz/quiz-a").status_code == 302  # without it: not signed in


@pytest.mark.parametrize("path", ["/signin", "/licenses"])
def test_pages_send_security_headers(world: World, path: str) -> None:
    r = world.app.test_client().get(path)
    csp = r.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'self'" in csp
    assert "'unsafe-inline'" not in csp.split("script-src")[1].split(";")[0]
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Referrer-Policy"] == "same-origin"


def test_pages_answer_404_as_a_page_and_the_api_as_json(world: World) -> None:
    c = world.app.test_client()
    r = c.get("/no/such/page")
    assert r.status_code == 404 and r.mimetype == "text/html"
    r = c.get("/api/v1/no/such")
    assert r.status_code == 404 and r.is_json


@pytest.mark.parametrize(
    "path",
    ["/submissions/{n}", "/submissions/{n}/status.json", "/a/x/students/{n}"],
)
def test_page_ids_no_row_can_have_are_404_not_an_overflow(world: World, path: str) -> None:
    # on PostgreSQL an id past the 32-bit column reached the query and was a 500
    c = world.app.test_client()
    assert _signin(c, world.tokens["prof"]).status_code in (302, 303)
    for n in (0, 2**31, 30541092336120229888):
        r = c.get(path.format(n=n))
        assert r.status_code == 404, (path, n, r.status_code)


def test_flask_session_is_read_only_from_its_cookie(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flask import Flask, Request
    from werkzeug.test import EnvironBuilder

    from service.web.session import FlaskCookieSessions

    app, sessions = world.app, world.app.session_interface
    assert isinstance(sessions, FlaskCookieSessions)
    cookie = sessions.get_signing_serializer(app).dumps({"n": 1})
    name = sessions.get_cookie_name(app)

    def request(**headers: str) -> Request:
        return Request(EnvironBuilder(path="/api/v1/whoami", headers=headers).get_environ())

    assert dict(sessions.open_session(app, request(Cookie=f"{name}={cookie}"))) == {"n": 1}
    assert sessions.open_session(Flask("no-secret-key"), request()) is None
    built = []
    monkeypatch.setattr(sessions, "get_signing_serializer", lambda a: built.append(a))
    assert dict(sessions.open_session(app, request())) == {}
    # an API call with its bearer token: no cookie, no signing serializer built for it
    assert world.get("/api/v1/whoami", "alice").status_code == 200
    assert built == []
