"""Locust users for ``benchmarks/load/run_load.py``: students taking a quiz over the API.

One task is one attempt, as the issue measured it: start, eight answers (each with its
feedback), submit; ten requests. Students take turns from a file of tokens so that no one runs
out of attempts (three per quiz). ``KGRADE_LOAD_TARGET=bare`` sends the same ten requests to the
minimal Flask app (``bare_app.py``), the framework's own cost under the same gunicorn and client.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
from pathlib import Path
from typing import Any

from locust import constant, task
from locust.contrib.fasthttp import FastHttpUser

QUIZ = os.environ.get("KGRADE_LOAD_QUIZ", "ring-attention-quiz")
_tokens = itertools.cycle(Path(os.environ["KGRADE_LOAD_TOKENS"]).read_text().split())
_lock = threading.Lock()


def _next_token() -> str:
    with _lock:
        return next(_tokens)


class Student(FastHttpUser):
    # a closed loop: each user sends its next request when the last one answered (throughput)
    wait_time = constant(0)

    def _post(self, name: str, url: str, expect: int, **kwargs: Any) -> dict[str, Any] | None:
        """One request of the flow; a reply other than ``expect`` is a failure and ends it."""
        with self.client.post(url, name=name, catch_response=True, **kwargs) as r:
            if r.status_code != expect:
                r.failure(f"{name}: {r.status_code} {r.text[:200]}")
                return None
            return r.json()

    @task
    def attempt(self) -> None:
        headers = {"Authorization": f"Bearer {_next_token()}"}
        att = self._post(
            "start", f"/api/v1/quizzes/{QUIZ}/attempts", 201, json={"lang": "en"}, headers=headers
        )
        if att is None:
            return
        for item in att["items"]:
            choice = random.choice(item["options"])["id"]
            body = {"item_id": item["id"], "answer": [choice]}
            url = f"/api/v1/attempts/{att['id']}/responses"
            if self._post("answer", url, 201, json=body, headers=headers) is None:
                return
        self._post("submit", f"/api/v1/attempts/{att['id']}/submit", 200, headers=headers)
