"""Request ids and JSON logs: from the API's response and log lines to the grading worker's."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import create_engine

from service import create_app
from service.db import Base, load_models
from tests.service.conftest import World
from workers import logs as wlogs


@pytest.fixture
def lite(tmp_path: Path) -> Flask:
    url = f"sqlite:///{tmp_path / 'k.sqlite3'}"
    load_models()
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
    return create_app(
        {"DATABASE_URL": url, "IMPORT_BANK": False, "TESTING": True, "LOG_REQUESTS": True}
    )


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """What the loggers write, as KGRADE_LOG_FORMAT=json would write it."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    wlogs.use_json(handler)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def _records(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def test_a_sane_request_id_is_kept_and_on_every_log_line(
    lite: Flask, json_lines: io.StringIO
) -> None:
    res = lite.test_client().get("/api/v1/quizzes", headers={"X-Request-ID": "lb-7f3a.9:x"})
    assert res.status_code == 401  # no token: the id is there on errors too
    assert res.headers["X-Request-ID"] == "lb-7f3a.9:x"
    access = [r for r in _records(json_lines) if r["logger"] == "kgrade.access"]
    assert len(access) == 1
    line = access[0]
    assert line["request_id"] == "lb-7f3a.9:x"
    assert line["status"] == 401 and line["method"] == "GET"
    assert line["endpoint"] == "/api/v1/quizzes" and line["path"] == "/api/v1/quizzes"
    assert isinstance(line["duration_ms"], float) and line["level"] == "INFO"
    # Outside a request the id is gone again.
    assert wlogs.REQUEST_ID.get() == "-"


@pytest.mark.parametrize("given", [None, "", "x" * 129, "a b", "<script>", "-leading-dash"])
def test_a_missing_or_odd_request_id_is_replaced(lite: Flask, given: str | None) -> None:
    headers = {} if given is None else {"X-Request-ID": given}
    res = lite.test_client().get("/healthz", headers=headers)
    rid = res.headers["X-Request-ID"]
    assert rid != given and len(rid) == 32 and int(rid, 16) >= 0
    again = lite.test_client().get("/healthz", headers=headers).headers["X-Request-ID"]
    assert again != rid  # a new one per request
    # still what uuid.uuid4().hex gave: version 4, RFC 4122 variant
    assert uuid.UUID(hex=rid).version == 4 and uuid.UUID(hex=rid).variant == uuid.RFC_4122


def test_new_request_ids_are_uuid4_hex() -> None:
    from service.logs import new_request_id

    seen = {new_request_id() for _ in range(2000)}
    assert len(seen) == 2000
    for rid in seen:
        parsed = uuid.UUID(hex=rid)
        assert parsed.hex == rid and parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_json_formatter_writes_extras_and_tracebacks() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    wlogs.use_json(handler)
    wlogs.use_json(handler)  # idempotent: one filter
    assert sum(isinstance(f, wlogs.RequestIdFilter) for f in handler.filters) == 1
    log = logging.getLogger("kgrade.test.json")
    log.addHandler(handler)
    log.propagate = False
    token = wlogs.REQUEST_ID.set("rid-42")
    try:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("failed on %s", "ü", extra={"submission_id": 7, "odd": {1, 2}})
    finally:
        wlogs.REQUEST_ID.reset(token)
        log.removeHandler(handler)
    (line,) = _records(out)
    assert line["message"] == "failed on ü" and line["level"] == "ERROR"
    assert line["request_id"] == "rid-42" and line["submission_id"] == 7
    assert line["odd"] == "{1, 2}"  # not JSON: written as text, never dropped
    assert "RuntimeError: boom" in line["exc_info"]


def test_configure_logging_json_once_and_plain_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    monkeypatch.setenv("KGRADE_LOG_FORMAT", "plain")
    wlogs.configure_logging()
    assert root.handlers == before
    monkeypatch.setenv("KGRADE_LOG_FORMAT", "JSON")
    old_level = root.level
    try:
        wlogs.configure_logging()
        wlogs.configure_logging()
        ours = [h for h in root.handlers if h not in before]
        assert len(ours) == 1 and isinstance(ours[0].formatter, wlogs.JsonFormatter)
    finally:
        for h in root.handlers[:]:
            if h not in before:
                root.removeHandler(h)
        root.setLevel(old_level)
    monkeypatch.setenv("KGRADE_LOG_FORMAT", "yaml")
    with pytest.raises(ValueError, match="KGRADE_LOG_FORMAT"):
        wlogs.configure_logging()


def test_the_request_id_goes_with_the_submission_to_the_task(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.tasks import grade_submission

    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(grade_submission, "apply_async", lambda **kw: sent.append(kw))
    src = "def merge_attention(out_a, lse_a, out_b, lse_b):\n    return out_a, lse_a\n"
    r = world.post(
        "/api/v1/exercises/attention-merge/submissions",
        "alice",
        json={"source": src},
        headers={"X-Request-ID": "submit-123"},
    )
    assert r.status_code == 202, r.get_json()
    assert r.headers["X-Request-ID"] == "submit-123"
    assert [c["kwargs"] for c in sent] == [{"request_id": "submit-123"}]
    assert sent[0]["args"] == [r.get_json()["id"]]


def test_the_worker_logs_the_grading_under_the_request_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, json_lines: io.StringIO
) -> None:
    from workers import store as st
    from workers import tasks

    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'w.sqlite3'}")
    st._metadata.create_all(st.SubmissionStore(st.database_url()).engine)
    out = tasks.grade_submission.apply(args=[424242], kwargs={"request_id": "submit-9"}).get()
    assert out["status"] == "missing"
    mine = [r for r in _records(json_lines) if r["logger"] == "workers.tasks"]
    assert [r["message"] for r in mine] == [
        "grading submission 424242",
        "submission 424242 does not exist; dropping the task",
    ]
    assert {r["request_id"] for r in mine} == {"submit-9"}
    assert mine[0]["submission_id"] == 424242
    assert wlogs.REQUEST_ID.get() == "-"  # reset after the task
