"""The whole chain with real processes: the API's pages, Redis, a grading worker and the lti
worker, against the fake platform. Prints the time from a student's quiz submission to the
score arriving at the platform."""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.service.conftest import running_worker
from tests.service.lti.conftest import LtiWorld, content_item, text
from workers.exercises import load_exercise
from workers.queues import lti_worker_argv, worker_argv
from workers.verdicts import Verdict

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _wait(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_grades_reach_the_platform_through_real_workers(
    lti: LtiWorld, celery_redis: dict[str, str], backend: str, tmp_path: Path
) -> None:
    lti.app.config["TASKS_EAGER"] = False
    env = dict(os.environ, **celery_redis, DATABASE_URL=backend, KGRADE_VAR_DIR=str(tmp_path))
    tag = uuid.uuid4().hex[:6]
    with (
        running_worker(lti_worker_argv(f"lti-{tag}@%h"), env, tmp_path),
        running_worker(worker_argv(["cpu"], f"cpu-{tag}@%h"), env, tmp_path),
    ):
        quiz = content_item(lti.deep_link(lti.browser(), resource="quiz:quiz-a"))
        exercise = content_item(lti.deep_link(lti.browser(), resource="exercise:attention-merge"))
        line = f"{lti.platform.url}/lineitems/1"

        # A quiz: submitted through the pages, posted by the lti worker.
        b, landing = lti.student(
            "s1", custom={"kgrade_assignment": quiz["custom"]["kgrade_assignment"]}, lineitem=line
        )
        html = landing.get_data(as_text=True)
        start = re.search(r'action="([^"]+/start)"', html).group(1)
        aid = quiz["custom"]["kgrade_assignment"]
        page = b.follow(b.post_form(start, html, {"assignment_id": aid, "view": "all"}))
        attempt = b.page_url.split("?")[0]
        csrf = b.csrf(page.get_data(as_text=True))
        b.client.post(
            f"{attempt}/answer", data={"csrf_token": csrf, "item_id": "q1", "answer": ["b"]}
        )
        t0 = time.time()
        r = b.client.post(f"{attempt}/submit", data={"csrf_token": csrf})
        assert r.status_code == 303
        _wait(lambda: len(lti.platform.scores) >= 1, 60, "the quiz score")
        quiz_ms = (lti.platform.scores[0]["received"] - t0) * 1000
        assert lti.platform.scores[0]["scoreGiven"] == 2.0
        assert lti.platform.scores[0]["gradingProgress"] == "FullyGraded"

        # A kernel exercise: Pending at once, then the grading worker's verdict.
        ex_aid = exercise["custom"]["kgrade_assignment"]
        b2, ex_page = lti.student("s2", custom={"kgrade_assignment": ex_aid}, lineitem=line)
        solution = next(
            s for s in load_exercise("attention-merge").solutions() if s.expected is Verdict.PASS
        )
        r = b2.post_form(
            "/exercise/attention-merge/submit",
            ex_page.get_data(as_text=True),
            {"assignment_id": ex_aid, "source": solution.path.read_text()},
        )
        assert r.status_code == 303
        sub_url = r.headers["Location"]
        _wait(lambda: len(lti.platform.scores) >= 2, 60, "the Pending score")
        assert lti.platform.scores[1]["gradingProgress"] == "Pending"
        assert "Grading" in text(b2.get(sub_url))  # the progress box while it grades
        _wait(lambda: len(lti.platform.scores) >= 3, 240, "the graded score")
        graded = lti.platform.scores[2]
        assert graded["userId"] == "s2" and graded["gradingProgress"] == "FullyGraded"
        assert graded["comment"].startswith("PASS") and graded["scoreGiven"] > 0
        done = text(b2.get(sub_url))
        assert "Passed" in done and "Tests" in done
        status = b2.get(f"{sub_url}/status.json").get_json()
        assert status["finished"] and status["verdict"] == "PASS"
    print(f"quiz submission -> score at the platform, real lti worker on Redis: {quiz_ms:.0f} ms")
