"""The OpenAPI document lists every route, parameter, body, response and error; /docs shows it."""

from __future__ import annotations

import re
from typing import Any

from flask import Flask

from tests.service.conftest import World

METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}


def _spec(world: World) -> dict[str, Any]:
    r = world.client.get("/api/v1/openapi.json")
    assert r.status_code == 200
    return r.get_json()


def _api_routes(app: Flask) -> list[tuple[str, str]]:
    out = []
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/api/v1"):
            continue
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        out.extend((path, m.lower()) for m in rule.methods & METHODS)
    return out


def test_every_route_is_in_the_spec(world: World) -> None:
    spec = _spec(world)
    assert spec["openapi"].startswith("3.")
    routes = _api_routes(world.app)
    assert len(routes) >= 16
    for path, method in routes:
        assert path in spec["paths"], path
        assert method in spec["paths"][path], (method, path)


def test_documented_errors_and_security(world: World) -> None:
    spec = _spec(world)
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    ours = {p: v for p, v in spec["paths"].items() if not p.endswith(("/docs", "/openapi.json"))}
    for path, item in ours.items():
        for method, op in item.items():
            if method == "parameters" or "exercises" in path or "submissions" in path:
                continue
            codes = set(op["responses"])
            assert {"401", "403"} <= codes, (method, path)
            assert op["security"] == [{"bearerAuth": []}]
            assert op.get("summary"), (method, path)
            if "{quiz_id}" in path or "{attempt_id}" in path:
                assert "404" in codes, (method, path)
            if method in ("post", "put"):
                assert "422" in codes, (method, path)
    responses = spec["paths"]["/api/v1/attempts/{attempt_id}/responses"]["post"]
    assert {"200", "201", "400", "401", "403", "404", "409", "413", "422"} <= set(
        responses["responses"]
    )
    assert responses["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/Answer"
    )
    assert any(p["name"] == "Idempotency-Key" for p in responses["parameters"])
    create = spec["paths"]["/api/v1/quizzes"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/QuizData"
    )
    export = spec["paths"]["/api/v1/quizzes/{quiz_id}/export"]["get"]
    assert {p["name"] for p in export["parameters"]} >= {"format", "lang", "mlang"}
    get_quiz = spec["paths"]["/api/v1/quizzes/{quiz_id}"]
    assert get_quiz["parameters"][0]["name"] == "quiz_id"
    assert get_quiz["get"]["parameters"][0]["schema"]["enum"] == ["en", "source"]
    assert spec["components"]["schemas"]["Error"]["properties"].keys() >= {
        "code",
        "message",
        "errors",
    }


def test_docs_page_lists_every_operation(world: World) -> None:
    spec = _spec(world)
    r = world.client.get("/api/v1/docs")
    assert r.status_code == 200 and r.mimetype == "text/html"
    html = r.get_data(as_text=True)
    assert "<script" not in html and "http://" not in html and "https://" not in html
    for path, item in spec["paths"].items():
        for method in item:
            if method == "parameters":
                continue
            assert f'data-path="{path}" data-method="{method.upper()}"' in html, (method, path)
    for name in ("Idempotency-Key", "QuizData", "Feedback", "Error", "409", "413"):
        assert name in html
