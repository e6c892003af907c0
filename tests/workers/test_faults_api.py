"""A submission while the broker is down (the API on SQLite and PostgreSQL, as in
tests/service): a clear 503 with Retry-After and nothing stored; and if the broker fails only
after the commit, the row stays queued (``unsent``) and the reaper sends it later."""

from __future__ import annotations

import re
import socket
from typing import Any

import pytest
from sqlalchemy import func, select

from service.db.submissions import submissions
from tests.service import conftest as service_fixtures
from tests.service.conftest import World, db_engine
from workers import celery_app as ca
from workers import reaper
from workers import store as st

# The API fixtures of tests/service (an app on SQLite and on PostgreSQL, tokens), shared here.
_apps = service_fixtures._apps
app = service_fixtures.app
backend = service_fixtures.backend
client = service_fixtures.client
pg_schema_factory = service_fixtures.pg_schema_factory
world = service_fixtures.world

URL = "/api/v1/exercises/attention-merge/submissions"


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def _rows(world: World) -> list[Any]:
    with db_engine(world.app).connect() as conn:
        return list(conn.execute(select(submissions)).all())


def test_a_submission_while_the_broker_is_down_gets_503_and_stores_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(ca.app.conf, "broker_url", f"redis://127.0.0.1:{_dead_port()}/0")
    r = world.post(URL, "alice", json={"source": "def f():\n    pass\n"})
    assert r.status_code == 503, r.get_data(as_text=True)
    assert int(r.headers["Retry-After"]) > 0
    assert "grading queue is unavailable" in r.get_json()["message"]
    assert _rows(world) == []  # nothing to grade later, no rate-limit slot used


def test_the_submit_page_while_the_broker_is_down_says_so_with_503(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = world.app.test_client()
    page = c.get("/signin").get_data(as_text=True)
    form = re.search(r'name="signin_token" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    c.post("/signin", data={"token": world.tokens["alice"], "signin_token": form})
    html = c.get("/exercise/attention-merge").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]
    monkeypatch.setitem(ca.app.conf, "broker_url", f"redis://127.0.0.1:{_dead_port()}/0")
    r = c.post(
        "/exercise/attention-merge/submit",
        data={"source": "def f():\n    pass\n", "csrf_token": csrf},
    )
    assert r.status_code == 503 and int(r.headers["Retry-After"]) > 0
    assert "grading queue is unavailable" in r.get_data(as_text=True)
    assert _rows(world) == []


def test_a_send_that_fails_after_the_commit_leaves_a_queued_row_the_reaper_sends(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.tasks import grade_submission

    monkeypatch.setattr(ca, "broker_reachable", lambda *a, **k: True)

    def fail(*_a: Any, **_k: Any) -> None:
        raise ConnectionError("the broker went away after the check")

    monkeypatch.setattr(grade_submission, "apply_async", fail)
    r = world.post(URL, "alice", json={"source": "def f():\n    pass\n"})
    assert r.status_code == 202, r.get_json()
    (sub,) = _rows(world)
    # Stored, not graded, not an error: queued, and it says it has not been sent yet.
    assert (sub.status, sub.progress_phase, sub.verdict) == (st.QUEUED, "unsent", None)
    sent: list[tuple[int, str, str]] = []
    engine = db_engine(world.app)
    got = reaper.reap(engine, lambda *a: sent.append(a), lambda: set(), stuck_after_s=0)
    assert [r.submission_id for r in got] == [sub.id] and sent[0][0] == sub.id
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(submissions)).scalar_one() == 1
        assert conn.execute(select(submissions.c.task_id)).scalar_one() == sent[0][2]
