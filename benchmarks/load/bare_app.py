"""The baseline for ``run_load.py``: a minimal Flask app answering the quiz flow's ten requests
with bodies of the same shape and size, no database, no auth. Served by the same gunicorn
command, config and worker class as kgrade, it is what the framework and server cost alone."""

from __future__ import annotations

import itertools
from typing import Any

from flask import Flask, request

_ids = itertools.count(1)
_OPTIONS = [{"id": k, "text": f"option {k} " + "x" * 60} for k in "abcd"]
_ITEMS = [
    {"id": f"q{i}", "type": "multiple_choice", "prompt": "p " * 80, "options": _OPTIONS}
    for i in range(1, 9)
]


def create_app() -> Flask:
    app = Flask(__name__)

    @app.post("/api/v1/quizzes/<quiz_id>/attempts")
    def start(quiz_id: str) -> tuple[dict[str, Any], int]:
        body = request.get_json()
        return {
            "id": f"a{next(_ids)}",
            "quiz_id": quiz_id,
            "lang": body["lang"],
            "items": _ITEMS,
        }, 201

    @app.post("/api/v1/attempts/<attempt_id>/responses")
    def answer(attempt_id: str) -> tuple[dict[str, Any], int]:
        body = request.get_json()
        return {
            "item_id": body["item_id"],
            "answer": body["answer"],
            "correct": body["answer"] == ["a"],
            "points": 1.0,
            "explanation": "e " * 120,
        }, 201

    @app.post("/api/v1/attempts/<attempt_id>/submit")
    def submit(attempt_id: str) -> dict[str, Any]:
        return {"attempt_id": attempt_id, "score": 4.0, "max_score": 8.0, "items": []}

    return app
