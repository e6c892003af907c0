"""LTI fixtures: a fake platform registered with the tool, and browsers (test clients) that
log in, launch and follow the tool's redirects as an LMS user's browser would."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from flask import Flask
from flask.testing import FlaskClient

import service.lti.tasks  # noqa: F401 - registers the passback tasks run eagerly here
from service.db import write_intent
from service.extensions import db
from service.lti.platforms import PlatformSpec, register
from service.web import security
from tests.service.lti.platform import INSTRUCTOR, LEARNER, FakePlatform

TOOL = "https://tool.test"


@pytest.fixture
def platform() -> Iterator[FakePlatform]:
    p = FakePlatform()
    try:
        yield p
    finally:
        p.stop()


def register_platform(app: Flask, p: FakePlatform) -> None:
    with app.app_context(), write_intent():
        register(
            db.session,
            PlatformSpec(
                issuer=p.issuer,
                client_id=p.client_id,
                auth_login_url=p.login_url,
                auth_token_url=p.token_url,
                key_set_url=p.jwks_url,
                deployments=(p.deployment_id,),
            ),
        )
        db.session.commit()
    security.forget_origins()


class ToolClient(FlaskClient):
    """A test client that talks to the tool at https://tool.test, as a browser would (TLS:
    cookies are Secure)."""

    def open(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs.setdefault("base_url", TOOL)
        return super().open(*args, **kwargs)


@dataclass
class Browser:
    """One person's browser: a test client with its own cookies."""

    client: FlaskClient
    lti: LtiWorld
    page_url: str = ""
    kgs: str | None = None

    def login(self, **params: str) -> Any:
        p = self.lti.platform
        data = {
            "iss": p.issuer,
            "login_hint": "hint-1",
            "target_link_uri": f"{TOOL}/lti/launch",
            "client_id": p.client_id,
            "lti_deployment_id": p.deployment_id,
            **params,
        }
        return self.client.post("/lti/login", data=data)

    def start(self) -> tuple[str, str]:
        """A login that worked: the (state, nonce) the tool sent to the platform."""
        r = self.login()
        assert r.status_code == 302, r.get_data(as_text=True)
        q = parse_qs(urlsplit(r.headers["Location"]).query)
        return q["state"][0], q["nonce"][0]

    def post_launch(self, id_token: str, state: str, **extra: str) -> Any:
        return self.client.post("/lti/launch", data={"id_token": id_token, "state": state, **extra})

    def launch(self, **claims: Any) -> Any:
        """Log in, launch with the claims, and follow the tool to its page (asserting 2xx)."""
        state, nonce = self.start()
        r = self.post_launch(self.lti.platform.id_token(nonce, **claims), state)
        assert r.status_code == 303, r.get_data(as_text=True)
        return self.follow(r)

    def follow(self, r: Any) -> Any:
        while r.status_code in (302, 303):
            loc = r.headers["Location"]
            r = self.client.get(loc)
            self.page_url = loc
            q = parse_qs(urlsplit(loc).query)
            if "kgs" in q:
                self.kgs = q["kgs"][0]
        return r

    def csrf(self, html: str) -> str:
        m = re.search(r'name="csrf_token" value="([^"]+)"', html)
        assert m, "no CSRF token in the page"
        return m.group(1)

    def get(self, url: str, **kw: Any) -> Any:
        return self.client.get(url, **kw)

    def post_form(self, url: str, page_html: str, data: dict[str, Any]) -> Any:
        return self.client.post(url, data={"csrf_token": self.csrf(page_html), **data})


@dataclass
class LtiWorld:
    app: Flask
    platform: FakePlatform

    def browser(self) -> Browser:
        return Browser(ToolClient(self.app, self.app.response_class, use_cookies=True), self)

    def student(self, sub: str = "s1", **claims: Any) -> tuple[Browser, Any]:
        b = self.browser()
        return b, b.launch(sub=sub, roles=[LEARNER], **claims)

    def instructor(self, sub: str = "t1", **claims: Any) -> tuple[Browser, Any]:
        b = self.browser()
        return b, b.launch(sub=sub, roles=[INSTRUCTOR], **claims)

    def deep_link(self, browser: Browser, **form: str) -> dict[str, Any]:
        """An instructor's deep-linking launch and pick; the content items the platform got."""
        page = browser.launch(sub="t1", roles=[INSTRUCTOR], message_type="LtiDeepLinkingRequest")
        assert page.status_code == 200, page.get_data(as_text=True)
        html = page.get_data(as_text=True)
        r = browser.post_form(browser.page_url.split("?")[0], html, {"action": "add", **form})
        assert r.status_code == 200, r.get_data(as_text=True)
        m = re.search(r'name="JWT" value="([^"]+)"', r.get_data(as_text=True))
        assert m
        return self.platform.verify_tool_jwt(m.group(1), self.platform.issuer)


@pytest.fixture
def lti(app: Flask, platform: FakePlatform, world: Any) -> LtiWorld:
    """The tool with the fake platform registered; passbacks run in-process (eager)."""
    app.config["TASKS_EAGER"] = True
    register_platform(app, platform)
    platform.tool_jwks = lambda: app.test_client().get("/lti/jwks").get_json()
    yield LtiWorld(app, platform)
    app.config["TASKS_EAGER"] = False


def content_item(dl_claims: dict[str, Any]) -> dict[str, Any]:
    items = dl_claims["https://purl.imsglobal.org/spec/lti-dl/claim/content_items"]
    assert len(items) == 1
    return items[0]


def dumps(x: Any) -> str:
    return json.dumps(x, indent=1, default=str)


def text(r: Any) -> str:
    """A response's body as a person reads it (HTML entities decoded)."""
    import html

    return html.unescape(r.get_data(as_text=True))


def take_quiz(b: Browser, landing: Any, answers: dict[str, list[str]]) -> Any:
    """From a quiz's page: start an attempt, answer ``answers`` (item -> option ids) through the
    pages, submit; the review page."""
    html = landing.get_data(as_text=True)
    start = re.search(r'<form method="post" action="([^"]+/start)"', html)
    assert start, "no start button on the quiz page"
    fields = dict(
        re.findall(r'<input type="hidden" name="(assignment_id|lang)" value="([^"]*)"', html)
    )
    r = b.post_form(start.group(1), html, {**fields, "view": "all"})
    assert r.status_code == 303, text(r)
    page = b.follow(r)
    attempt_url = b.page_url.split("?")[0]
    for item, chosen in answers.items():
        r = b.client.post(
            f"{attempt_url}/answer",
            data={
                "csrf_token": b.csrf(page.get_data(as_text=True)),
                "item_id": item,
                "answer": chosen,
                "view": "all",
            },
        )
        assert r.status_code == 303, text(r)
    r = b.client.post(
        f"{attempt_url}/submit", data={"csrf_token": b.csrf(page.get_data(as_text=True))}
    )
    assert r.status_code == 303, text(r)
    return b.follow(r)
