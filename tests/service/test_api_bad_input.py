"""Bad input: every malformed request is a JSON 4xx naming the problem, and changes nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy.orm import Session

from service.db import write_intent
from tests.service.conftest import QUIZ_A, QUIZ_B, REPO, World, quiz_data, table_snapshot

MALFORMED_BODIES: list[tuple[str, bytes, str]] = [
    ("invalid json", b'{"item_id": "q1", ', "application/json"),
    ("truncated", b"{", "application/json"),
    ("not utf-8", b'{"item_id": "\xff\xfe"}', "application/json"),
    ("json list", b"[1, 2, 3]", "application/json"),
    ("json string", b'"hello"', "application/json"),
    ("json number", b"42", "application/json"),
    ("json null", b"null", "application/json"),
    ("deep nesting", b"[" * 5000 + b"]" * 5000, "application/json"),
    (
        "wrong types",
        json.dumps({"item_id": [], "answer": {"a": 1}, "lang": 3}).encode(),
        "application/json",
    ),
    (
        "huge strings",
        json.dumps(
            {
                "item_id": "q" * 10000,
                "answer": ["b" * 10000],
                "lang": "x" * 10000,
                "dry_run": "x" * 10000,
            }
        ).encode(),
        "application/json",
    ),
    ("form encoded", b"item_id=q1&answer=b", "application/x-www-form-urlencoded"),
    ("empty", b"", "application/json"),
    ("no content type", b'{"item_id": "q1"}', ""),
    ("nan", b'{"item_id": "q1", "answer": [NaN], "dry_run": NaN}', "application/json"),
    (
        "nulls",
        b'{"item_id": null, "answer": null, "lang": null, "dry_run": null}',
        "application/json",
    ),
    ("unknown fields", b'{"zzz": 1}', "application/json"),
]


def _endpoints(world: World, attempt_id: str) -> list[tuple[str, str, str]]:
    return [
        ("post", "/api/v1/quizzes", "prof"),
        ("put", "/api/v1/quizzes/quiz-a", "prof"),
        ("post", "/api/v1/quizzes/quiz-a/attempts", "alice"),
        ("post", f"/api/v1/attempts/{attempt_id}/responses", "alice"),
        ("post", "/api/v1/quizzes/quiz-a/regrade", "prof"),
    ]


def _assert_json_error(r: Any, what: str) -> dict[str, Any]:
    assert 400 <= r.status_code < 500, (what, r.status_code, r.data[:300])
    assert r.is_json, what
    body = r.get_json()
    assert body["code"] == r.status_code and body.get("message"), (what, body)
    return body


@pytest.mark.parametrize(
    ("name", "raw", "ctype"), MALFORMED_BODIES, ids=[m[0] for m in MALFORMED_BODIES]
)
def test_malformed_bodies_are_4xx_and_change_nothing(
    world: World, name: str, raw: bytes, ctype: str
) -> None:
    attempt_id = world.start("quiz-a")["id"]
    world.answer(attempt_id, "q1", ["b"])
    before = table_snapshot(world.app)
    for method, url, who in _endpoints(world, attempt_id):
        headers = world.h(who)
        if ctype:
            headers["Content-Type"] = ctype
        r = getattr(world.client, method)(url, data=raw, headers=headers)
        if r.status_code < 300:
            # Some endpoints take an optional body: a body-less start or regrade is legitimate.
            assert url.endswith(("/attempts", "/regrade")), (name, url)
            continue
        _assert_json_error(r, f"{name} {method} {url}")
    after = table_snapshot(world.app)
    for table in before:
        if table in ("attempts", "responses", "idempotency_keys"):
            continue  # legitimately written by a body-less start
        assert before[table] == after[table], (name, table)
    # Nothing changed in what was already there.
    assert set(before["responses"]) <= set(after["responses"])


def test_invalid_json_is_400_naming_the_body(world: World) -> None:
    aid = world.start("quiz-a")["id"]
    for url in (f"/api/v1/attempts/{aid}/responses", "/api/v1/quizzes"):
        who = "alice" if "attempts" in url else "prof"
        r = world.client.post(
            url, data=b"{nope", headers={**world.h(who), "Content-Type": "application/json"}
        )
        assert r.status_code == 400
        assert r.get_json()["errors"] == {"json": ["Invalid JSON body."]}


def test_validation_errors_name_the_field_in_the_message(world: World) -> None:
    aid = world.start("quiz-a")["id"]
    r = world.post(f"/api/v1/attempts/{aid}/responses", "alice", json={"item_id": "q1"})
    body = r.get_json()
    assert r.status_code == 422
    assert body["errors"] == {"json": {"answer": ["Missing data for required field."]}}
    assert body["message"].startswith("json.answer:")


def test_oversized_payload_is_json_413(
    world: World, app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(app.config, "MAX_CONTENT_LENGTH", 10_000)
    before = table_snapshot(app)
    data = quiz_data(QUIZ_A, id="quiz-big")
    data["description"]["en"] = "x" * 20_000
    r = world.post("/api/v1/quizzes", "prof", json=data)
    body = _assert_json_error(r, "oversized")
    assert r.status_code == 413
    aid = world.start("quiz-b")["id"]
    r = world.post(
        f"/api/v1/attempts/{aid}/responses",
        "alice",
        json={"item_id": "x1", "answer": ["two"] * 5000},
    )
    assert r.status_code == 413
    assert body["status"] == "Request Entity Too Large"
    assert before["quizzes"] == table_snapshot(app)["quizzes"]


def test_unknown_routes_and_methods_are_json(world: World) -> None:
    r = world.get("/api/v1/nothing-here", "alice")
    assert r.status_code == 404 and r.is_json and r.get_json()["message"]
    r = world.client.delete("/api/v1/quizzes/quiz-a", headers=world.h("prof"))
    assert r.status_code == 405 and r.is_json
    r = world.client.patch("/api/v1/attempts/x/submit", headers=world.h("alice"))
    assert r.status_code == 405 and r.is_json


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/quizzes/%00",
        "/api/v1/quizzes/" + "a" * 3000,
        "/api/v1/quizzes/..%2F..%2Fetc",
        "/api/v1/quizzes/quiz-a?lang=" + "x" * 3000,
        "/api/v1/quizzes/quiz-a?lang=",
        "/api/v1/attempts/%E2%98%83",
        "/api/v1/attempts/" + "z" * 500,
        "/api/v1/attempts/%00" + "a" * 31,
        "/api/v1/quizzes/quiz-a/grades?x=%00",
        "/api/v1/quizzes/quiz-a?lang=%00",
    ],
)
def test_odd_ids_and_queries_are_4xx(world: World, url: str) -> None:
    r = world.get(url, "alice")
    _assert_json_error(r, url)


def test_odd_ids_in_writes_are_4xx(world: World) -> None:
    before = table_snapshot(world.app)
    for url in (
        "/api/v1/attempts/" + "z" * 500 + "/responses",
        "/api/v1/attempts/%E2%98%83/submit",
        "/api/v1/quizzes/" + "q" * 500 + "/attempts",
        "/api/v1/quizzes/quiz%00/attempts",
        "/api/v1/quizzes/quiz%00/regrade",
    ):
        r = world.post(url, "alice", json={"item_id": "q1", "answer": ["b"]})
        _assert_json_error(r, url)
    assert table_snapshot(world.app) == before


def test_quiz_bodies_with_wrong_shapes(world: World) -> None:
    before = table_snapshot(world.app)
    bad: list[Any] = [
        {"id": "x"},
        quiz_data(QUIZ_A, id="bad id!"),
        quiz_data(QUIZ_A, id="q-new", items="nope"),
        quiz_data(QUIZ_A, id="q-new", title="bare string"),
        quiz_data(QUIZ_A, id="q-new", settings={"allowed_attempts": 0}),
        quiz_data(QUIZ_A, id="q-new", settings={"allowed_attempts": "three"}),
        quiz_data(QUIZ_A, id="q-new", source_lang="xx"),
        quiz_data(QUIZ_A, id="q-new", unknown_key=1),
        quiz_data(QUIZ_A, id="q-new", items=[{"id": "q1"}] * 3),
        quiz_data(QUIZ_A, id="q-new", items=[QUIZ_A["items"][0]] * 2),  # duplicate item ids
        quiz_data(QUIZ_A, id="q\u0000new"),
    ]
    for body in bad:
        r = world.post("/api/v1/quizzes", "prof", json=body)
        assert r.status_code == 422, (body.get("id"), r.get_json())
        assert r.get_json()["errors"]["json"]
        # PUT with the body's id set to the URL's (an invalid id becomes a mismatch instead).
        fixed = body if body["id"] in ("bad id!", "q\u0000new") else {**body, "id": "quiz-a"}
        r = world.put("/api/v1/quizzes/quiz-a", "prof", json=fixed)
        assert r.status_code == 422, (body["id"], r.get_json())
    assert table_snapshot(world.app) == before


def test_nul_bytes_in_texts_and_answers(world: World) -> None:
    data = quiz_data(QUIZ_B, id="quiz-nul")
    data["title"]["text"] = "Title with \u0000 NUL"
    r = world.post("/api/v1/quizzes", "prof", json=data)
    assert r.status_code in (201, 422), r.get_json()
    if r.status_code == 201:
        assert (
            world.get("/api/v1/quizzes/quiz-nul", "alice").get_json()["title"]
            == "Title with \u0000 NUL"
        )
    aid = world.start("quiz-b")["id"]
    for body in (
        {"item_id": "x1\u0000", "answer": ["two"]},
        {"item_id": "x1", "answer": ["two\u0000"]},
    ):
        r = world.post(f"/api/v1/attempts/{aid}/responses", "alice", json=body)
        assert r.status_code == 422, body
    r = world.post("/api/v1/quizzes/quiz-b/attempts", "alice", json={"lang": "en\u0000"})
    assert r.status_code == 422


# ---- ids out of the database's range, deep nesting, long headers (issue 16) ----------------


@pytest.mark.parametrize(
    "sid", ["0", "2147483648", "9223372036854775808", "30541092336120229888", "2147483647"]
)
def test_submission_ids_beyond_the_database_are_404_naming_the_field(
    world: World, sid: str
) -> None:
    for who in ("alice", "prof"):
        r = world.get(f"/api/v1/submissions/{sid}", who)
        body = _assert_json_error(r, sid)
        assert r.status_code == 404
        assert body["errors"] == {"path": {"submission_id": [f"unknown submission {int(sid)}"]}}


def test_body_nested_10000_deep_is_400_and_starts_no_attempt(world: World) -> None:
    raw = b"[" * 10_000 + b"]" * 10_000
    before = table_snapshot(world.app)
    for method, url, who in _endpoints(world, "0" * 32):
        headers = {**world.h(who), "Content-Type": "application/json"}
        r = getattr(world.client, method)(url, data=raw, headers=headers)
        body = _assert_json_error(r, url)
        assert r.status_code == 400 and body["errors"] == {"json": ["Invalid JSON body."]}, url
    assert table_snapshot(world.app) == before
    # The student still has both of quiz A's attempts.
    world.start("quiz-a")
    world.start("quiz-a")


def test_long_idempotency_key_is_400_naming_the_header(world: World) -> None:
    before = table_snapshot(world.app)
    r = world.post(
        "/api/v1/quizzes/quiz-a/attempts",
        "alice",
        json={},
        headers={"Idempotency-Key": "k" * 10_000},
    )
    body = _assert_json_error(r, "long key")
    assert r.status_code == 400 and "Idempotency-Key" in body["errors"]["headers"]
    assert table_snapshot(world.app) == before


@pytest.fixture(scope="module")
def real_gunicorn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """``kgrade serve``'s gunicorn command line on a migrated SQLite file: (port, a token)."""
    from service.auth import create_token
    from service.cli.db import upgrade_and_import
    from service.cli.serve import gunicorn_argv
    from service.db import make_engine

    folder = tmp_path_factory.mktemp("gunicorn")
    url = f"sqlite:///{folder / 'kgrade.sqlite3'}"
    upgrade_and_import(url, import_bank=False)
    engine = make_engine(url)
    with write_intent(), Session(engine) as sess:
        token = create_token(sess, role="student", name="g")[1]
        sess.commit()
    engine.dispose()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": url, "KGRADE_IMPORT_BANK": "0"}
    log = (folder / "gunicorn.log").open("wb")
    proc = subprocess.Popen(
        gunicorn_argv("127.0.0.1", port, 1, 2, 30), env=env, stdout=log, stderr=log, cwd=REPO
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (folder / "gunicorn.log").read_text()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.1)
        yield port, token
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def _raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_gunicorn_answers_long_and_broken_requests_with_json(
    real_gunicorn: tuple[int, str],
) -> None:
    port, token = real_gunicorn
    auth = f"Authorization: Bearer {token}\r\n".encode()

    def get(path: str, extra: bytes = b"") -> tuple[int, dict[str, Any]]:
        req = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
        status, headers, body = _raw(port, req + auth + extra + b"\r\n")
        assert headers.get("Content-Type", "").startswith("application/json"), (status, body)
        out = json.loads(body)
        assert out["code"] == status and out["message"], out
        return status, out

    # A 10,000-character key reaches the app, which names the header.
    key = b"Idempotency-Key: " + b"k" * 10_000 + b"\r\n"
    req = b"POST /api/v1/quizzes/none/attempts HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    req += auth + key + b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    status, headers, body = _raw(port, req)
    assert status == 400, body
    assert "Idempotency-Key" in json.loads(body)["errors"]["headers"]
    # Beyond gunicorn's own limits: its refusals are the API's JSON too.
    status, out = get("/api/v1/whoami", b"X-Big: " + b"x" * 40_000 + b"\r\n")
    assert status == 431
    status, out = get("/api/v1/quizzes/" + "q" * 9000)
    assert status == 414
    status, _, body = _raw(port, b"GARBAGE\r\n\r\n")
    assert status == 400 and json.loads(body)["code"] == 400
    # And the server still serves.
    assert get("/api/v1/submissions/30541092336120229888")[0] == 404
