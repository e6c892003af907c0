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

    @task
    def attempt(self) -> None:
        headers = {"Authorization": f"Bearer {_next_token()}"}
        with self.client.post(
            f"/api/v1/quizzes/{QUIZ}/attempts",
            json={"lang": "en"},
            headers=headers,
            name="start",
            catch_response=True,
        ) as r:
            if r.status_code != 201:
                r.failure(f"start: {r.status_code} {r.text[:200]}")
                return
            att = r.json()
        for item in att["items"]:
            choice = random.choice(item["options"])["id"]
            with self.client.post(
                f"/api/v1/attempts/{att['id']}/responses",
                json={"item_id": item["id"], "answer": [choice]},
                headers=headers,
                name="answer",
                catch_response=True,
            ) as r:
                if r.status_code != 201:
                    r.failure(f"answer: {r.status_code} {r.text[:200]}")
                    return
        with self.client.post(
            f"/api/v1/attempts/{att['id']}/submit",
            headers=headers,
            name="submit",
            catch_response=True,
        ) as r:
            if r.status_code != 200:
                r.failure(f"submit: {r.status_code} {r.text[:200]}")
