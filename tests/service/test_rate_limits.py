"""Rate limits (flask-limiter, ``service.extensions.rate_limits``): submissions per student,
failed sign-ins per address, probes never limited, counts shared through Redis, each limit in
the OpenAPI document."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import create_engine

from service import create_app
from service.auth import create_token
from service.db import load_models, write_intent
from service.db.base import Base
from service.extensions import db, rate_limits
from tests.service.conftest import World, table_snapshot

SUBMIT = "/api/v1/exercises/attention-merge/submissions"
GOOD = "import torch\n\ndef merge_attention(out_a, lse_a, out_b, lse_b):\n    return out_a, lse_a\n"


@pytest.fixture
def no_send(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Grading messages go nowhere (they are not what these tests are about)."""
    from workers.tasks import grade_submission

    sent: list[Any] = []
    monkeypatch.setattr(grade_submission, "apply_async", lambda *a, **k: sent.append(k))
    return sent


def _sqlite_app(tmp_path: Path, **config: Any) -> Flask:
    url = f"sqlite:///{tmp_path / f'{uuid.uuid4().hex}.sqlite3'}"
    load_models()
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
    return create_app({"DATABASE_URL": url, "IMPORT_BANK": False, "TESTING": True, **config})


def test_submission_limit_refuses_with_json_and_stores_nothing(
    world: World, app: Flask, no_send: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(app.config, "SUBMISSION_RATE", "2/60")
    # Refused input uses no slot: only accepted submissions count.
    assert world.post(SUBMIT, "alice", json={"source": ""}).status_code == 422
    first = world.post(SUBMIT, "alice", json={"source": GOOD}, headers={"Idempotency-Key": "k1"})
    assert first.status_code == 202
    assert world.post(SUBMIT, "alice", json={"source": GOOD}).status_code == 202
    before = table_snapshot(app)
    r = world.post(SUBMIT, "alice", json={"source": GOOD})
    assert r.status_code == 429 and r.mimetype == "application/json"
    body = r.get_json()
    assert body["code"] == 429 and body["status"] == "Too Many Requests"
    assert body["message"].startswith("rate limit: at most 2 submissions per 60 s per student")
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert table_snapshot(app) == before and len(no_send) == 2
    # A retry of an accepted submission is its replay, never a 429 (and uses no slot).
    again = world.post(SUBMIT, "alice", json={"source": GOOD}, headers={"Idempotency-Key": "k1"})
    assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json()["id"] == first.get_json()["id"]
    # Per student; instructors are exempt.
    assert world.post(SUBMIT, "bob", json={"source": GOOD}).status_code == 202
    for _ in range(3):
        assert world.post(SUBMIT, "prof", json={"source": GOOD}).status_code == 202
    # A changed setting applies at once (read per request).
    monkeypatch.setitem(app.config, "SUBMISSION_RATE", "3/60")
    assert world.post(SUBMIT, "alice", json={"source": GOOD}).status_code == 202


def _signin(client: FlaskClient, token: str, **kw: Any) -> Any:
    page = client.get("/signin", **kw).get_data(as_text=True)
    form_token = re.search(r'name="signin_token" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    return client.post("/signin", data={"token": token, "signin_token": form_token}, **kw)


def test_failed_signins_are_limited_per_address(
    world: World, app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(app.config, "SIGNIN_RATE", "2/60")
    c = app.test_client()
    # A classroom behind one address: successful sign-ins never count.
    for _ in range(3):
        assert _signin(c, world.tokens["alice"]).status_code == 303
    for _ in range(2):
        assert _signin(c, "kg_wrong").status_code == 401
    r = _signin(c, world.tokens["alice"])  # even the right token waits now
    assert r.status_code == 429 and r.mimetype == "text/html"
    assert "Try again in" in r.get_data(as_text=True)
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert c.get("/signin").status_code == 200  # the form itself is not limited
    js = _signin(c, "kg_wrong", headers={"Accept": "application/json"})
    assert js.status_code == 429 and js.get_json()["code"] == 429
    assert "failed sign-ins per 60 s per IP address" in js.get_json()["message"]
    # Another address is not affected.
    other = app.test_client()
    assert _signin(other, "kg_wrong", environ_base={"REMOTE_ADDR": "10.1.2.3"}).status_code == 401


def test_probes_are_never_limited(tmp_path: Path) -> None:
    """Even with a limit on every route (flask-limiter's RATELIMIT_APPLICATION setting)."""
    app = _sqlite_app(tmp_path, RATELIMIT_APPLICATION="2 per minute")
    c = app.test_client()
    for _ in range(5):
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
        assert c.get("/metrics").status_code != 429
    codes = [c.get("/api/v1/openapi.json").status_code for _ in range(3)]
    assert codes == [200, 200, 429]  # the limit is real elsewhere
    r = c.get("/api/v1/openapi.json")
    assert r.get_json()["code"] == 429 and "Retry-After" in r.headers


def test_the_app_wide_pass_runs_only_when_app_wide_limits_are_set(tmp_path: Path) -> None:
    # kgrade's own limits check themselves on their views; flask-limiter's before-request pass
    # (a third of a quiz request's CPU) stays only for a deployment's app-wide limits
    plain = _sqlite_app(tmp_path)
    hook = rate_limits.limiter(plain)._check_request_limit
    assert hook not in plain.before_request_funcs[None]
    limited = _sqlite_app(tmp_path, RATELIMIT_DEFAULT="5 per minute")
    assert rate_limits.limiter(limited)._check_request_limit in limited.before_request_funcs[None]


def test_limiter_hooks_are_skipped_in_requests_that_met_no_limit(tmp_path: Path) -> None:
    # flask-limiter's after-request and teardown hooks run behind a check that the request
    # made limiter state (its conditional deductions are tested above: refused submissions
    # use no slot); a quiz request makes none and skips them
    from flask_limiter._compat import request_context

    app = _sqlite_app(tmp_path)
    limiter = rate_limits.limiter(app)
    after, teardown = app.after_request_funcs[None], app.teardown_request_funcs[None]
    assert not any(getattr(h, "args", None) == (limiter,) for h in after)
    assert limiter._Limiter__release_context not in teardown
    assert [h.__name__ for h in after].count("after_request") == 1
    assert [h.__name__ for h in teardown].count("teardown_request") == 1
    made = []

    @app.after_request
    def look(resp: Any) -> Any:  # runs first (after-request hooks run in reverse)
        made.append(hasattr(request_context(), "_limiter_request_context"))
        return resp

    assert app.test_client().get("/api/v1/quizzes").status_code == 401
    assert made == [False]


def test_limits_are_in_the_openapi_document(tmp_path: Path) -> None:
    app = _sqlite_app(tmp_path, SUBMISSION_RATE="4/120")
    spec = app.test_client().get("/api/v1/openapi.json").get_json()
    post = spec["paths"]["/api/v1/exercises/{exercise_id}/submissions"]["post"]
    assert post["x-rate-limit"]["limit"] == 4 and post["x-rate-limit"]["window_seconds"] == 120
    assert post["x-rate-limit"]["per"] == "student"
    assert post["x-rate-limit"]["setting"] == "KGRADE_SUBMISSION_RATE"
    assert "at most 4 submissions per 120 s" in post["responses"]["429"]["description"]
    # Only the limited operations say so.
    limited = [
        (path, method)
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
        if isinstance(op, dict) and ("x-rate-limit" in op or "429" in op.get("responses", {}))
    ]
    assert limited == [("/api/v1/exercises/{exercise_id}/submissions", "post")]


def test_a_bad_setting_stops_the_start_naming_it(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="KGRADE_SUBMISSION_RATE"):
        _sqlite_app(tmp_path, SUBMISSION_RATE="six a minute")
    with pytest.raises(RuntimeError, match="KGRADE_SIGNIN_RATE"):
        _sqlite_app(tmp_path, SIGNIN_RATE="0/60")


def test_redis_counts_are_shared_between_apps(
    tmp_path: Path, redis_url: str, no_send: list[Any]
) -> None:
    """Two processes (pods) on one Redis share a student's count; another prefix does not."""
    import redis

    prefix = f"kgt-rl-{uuid.uuid4().hex[:8]}:"
    url = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    load_models()
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
    config = {
        "DATABASE_URL": url,
        "IMPORT_BANK": False,
        "TESTING": True,
        "RATE_LIMIT_STORAGE_URL": redis_url,
        "SUBMISSION_RATE": "2/60",
    }
    one = create_app({**config, "RATE_LIMIT_KEY_PREFIX": prefix})
    two = create_app({**config, "RATE_LIMIT_KEY_PREFIX": prefix})
    elsewhere = create_app({**config, "RATE_LIMIT_KEY_PREFIX": prefix + "other:"})
    with one.app_context(), write_intent():
        token = create_token(db.session, role="student", name="alice")[1]
        db.session.commit()
    auth = {"Authorization": f"Bearer {token}"}
    try:
        assert (
            one.test_client().post(SUBMIT, json={"source": GOOD}, headers=auth).status_code == 202
        )
        assert (
            two.test_client().post(SUBMIT, json={"source": GOOD}, headers=auth).status_code == 202
        )
        r = one.test_client().post(SUBMIT, json={"source": GOOD}, headers=auth)
        assert r.status_code == 429, r.get_json()
        assert (
            two.test_client().post(SUBMIT, json={"source": GOOD}, headers=auth).status_code == 429
        )
        ok = elsewhere.test_client().post(SUBMIT, json={"source": GOOD}, headers=auth)
        assert ok.status_code == 202
        assert redis.Redis.from_url(redis_url).keys(f"{prefix}*"), "nothing counted in Redis"
    finally:
        rate_limits.reset(one)
        rate_limits.reset(elsewhere)
    assert not redis.Redis.from_url(redis_url).keys(f"{prefix}*")
