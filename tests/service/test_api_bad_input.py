"""Bad input: every malformed request is a JSON 4xx naming the problem, and changes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask import Flask

from tests.service.conftest import QUIZ_A, QUIZ_B, World, quiz_data, table_snapshot

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
