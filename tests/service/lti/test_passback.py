"""Assignment and Grade Services: every graded event posts one score, by the assignment's
policy, to its line item; the line item is found before one is made; throttling, outages and
refusals are handled, and the instructor sees why a grade did not arrive."""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from service.cli import main
from service.core import grades
from service.core.tasks import task_session
from service.db.lti import GradePassback
from service.db.submissions import submissions
from service.extensions import db
from service.lti import tasks
from tests.service.lti.conftest import LtiWorld, content_item, take_quiz, text
from tests.service.lti.platform import INSTRUCTOR, Failure
from workers.store import SubmissionStore

# quiz-a (tests/service/conftest.py): q1 2 points (b), q2 3 points (n2 n4 n6), q3 1 point (f).
ALL_RIGHT = {"q1": ["b"], "q2": ["n2", "n4", "n6"], "q3": ["f"]}
HALF = {"q1": ["b"], "q3": ["f"]}


def _assign(lti: LtiWorld, resource: str = "quiz:quiz-a", policy: str = "best", **form: str) -> str:
    claims = lti.deep_link(lti.browser(), resource=resource, policy=policy, **form)
    return content_item(claims)["custom"]["kgrade_assignment"]


def _rows(lti: LtiWorld) -> list[GradePassback]:
    with lti.app.app_context():
        return list(db.session.execute(select(GradePassback).order_by(GradePassback.id)).scalars())


def test_quiz_grade_reaches_the_gradebook_by_policy(lti: LtiWorld) -> None:
    aid = _assign(lti, policy="best")
    custom = {"kgrade_assignment": aid}
    b, landing = lti.student("s1", custom=custom, lineitem=f"{lti.platform.url}/lineitems/1")
    t0 = time.time()
    review = take_quiz(b, landing, HALF)
    assert "3 / 6" in text(review)
    assert len(lti.platform.scores) == 1, lti.platform.scores
    first = lti.platform.scores[0]
    elapsed = first["received"] - t0
    assert first["lineitem"] == "1" and first["userId"] == "s1"
    assert first["scoreGiven"] == 3.0 and first["scoreMaximum"] == 6.0
    assert first["activityProgress"] == "Completed" and first["gradingProgress"] == "FullyGraded"
    stamp = datetime.fromisoformat(first["timestamp"])
    assert stamp.tzinfo is not None and re.search(r"\.\d{3}\+00:00$", first["timestamp"])
    # A better second attempt raises the grade (best); a worse third would not.
    landing = b.get(f"/a/{aid}")
    take_quiz(b, landing, ALL_RIGHT)
    assert [s["scoreGiven"] for s in lti.platform.scores] == [3.0, 6.0]
    later = datetime.fromisoformat(lti.platform.scores[1]["timestamp"])
    # Strictly later even in whole seconds (Moodle keeps seconds; it refuses a score whose time
    # is not after the one it holds).
    assert later.replace(microsecond=0) > stamp.replace(microsecond=0)
    # One token for both posts (cached), asked for with the AGS scopes the launch granted; the
    # instructor's launch fetched another for the roster.
    ags = [t for t in lti.platform.token_requests if "lti-ags/scope/score" in t["scope"]]
    assert len(ags) == 1
    assert all(r.status == "sent" for r in _rows(lti))
    print(f"quiz submitted -> score at the platform: {elapsed * 1000:.0f} ms")


def test_last_policy_posts_the_last_attempt(lti: LtiWorld) -> None:
    aid = _assign(lti, resource="quiz:quiz-b", policy="last")
    b, landing = lti.student(
        "s1", custom={"kgrade_assignment": aid}, lineitem=f"{lti.platform.url}/lineitems/1"
    )
    take_quiz(b, landing, {"x1": ["two"], "x2": ["four"]})
    take_quiz(b, b.get(f"/a/{aid}"), {"x1": ["three"]})
    assert [s["scoreGiven"] for s in lti.platform.scores] == [2.0, 0.0]


def test_one_event_is_posted_once(lti: LtiWorld) -> None:
    aid = _assign(lti)
    b, landing = lti.student(
        "s1", custom={"kgrade_assignment": aid}, lineitem=f"{lti.platform.url}/lineitems/1"
    )
    take_quiz(b, landing, HALF)
    (row,) = _rows(lti)
    with lti.app.app_context():
        # The task delivered again (a redelivered message): nothing more is posted.
        assert tasks.send_passback.apply(args=[row.id]).get()["status"] == "sent"
        # The same event recorded again: the same row, not a second one.
        again = grades.grade_event(db.session, aid, row.user_id, row.event)
        assert again is not None and again.id == row.id
        db.session.commit()
    assert len(lti.platform.scores) == 1 and len(_rows(lti)) == 1


def test_line_item_is_looked_up_before_one_is_made(lti: LtiWorld) -> None:
    aid = _assign(lti)
    # The link carries no line item: kgrade finds or makes the column itself.
    b, landing = lti.student("s1", custom={"kgrade_assignment": aid})
    take_quiz(b, landing, HALF)
    b2, landing2 = lti.student("s2", custom={"kgrade_assignment": aid})
    take_quiz(b2, landing2, ALL_RIGHT)
    assert len(lti.platform.lineitem_posts) == 1, lti.platform.lineitem_posts
    made = lti.platform.lineitem_posts[0]
    with lti.app.app_context():
        from service.db.courses import Assignment

        a = db.session.get(Assignment, aid)
        assert made["resourceId"] == a.line_item_resource_id and made["tag"] == "kgrade"
        assert made["scoreMaximum"] == 6.0 and made["resourceLinkId"] == "rl-1"
        assert a.lineitem_url and a.lineitem_url.endswith("/lineitems/2")
    assert [s["lineitem"] for s in lti.platform.scores] == ["2", "2"]


def test_an_existing_column_is_found_across_pages(lti: LtiWorld) -> None:
    aid = _assign(lti)
    with lti.app.app_context():
        from service.db.courses import Assignment

        rid = db.session.get(Assignment, aid).line_item_resource_id
    # The platform already has our column (say, made before a kgrade restore), on page 3.
    for i in range(2, 7):
        lti.platform.lineitems[str(i)] = {
            "id": f"{lti.platform.url}/lineitems/{i}",
            "resourceId": f"other-{i}",
            "scoreMaximum": 1,
        }
    lti.platform.lineitems["7"] = {
        "id": f"{lti.platform.url}/lineitems/7",
        "resourceId": rid,
        "scoreMaximum": 6,
    }
    lti.platform.page_size = 1
    b, landing = lti.student("s1", custom={"kgrade_assignment": aid})
    take_quiz(b, landing, HALF)
    assert lti.platform.lineitem_posts == []
    assert lti.platform.scores[0]["lineitem"] == "7"


@pytest.mark.parametrize(
    "failure",
    [
        Failure(429, {"Retry-After": "0"}),
        Failure(403, {"x-rate-limit-remaining": "0"}),  # Canvas's throttling
        Failure(503),
    ],
    ids=["429", "canvas-403-throttle", "503"],
)
def test_throttling_and_outages_are_retried_with_the_same_timestamp(
    lti: LtiWorld, failure: Failure
) -> None:
    aid = _assign(lti)
    b, landing = lti.student(
        "s1", custom={"kgrade_assignment": aid}, lineitem=f"{lti.platform.url}/lineitems/1"
    )
    lti.platform.fail_next("score", failure)
    take_quiz(b, landing, HALF)
    (row,) = _rows(lti)
    assert row.status == "sent" and row.tries == 2
    (score,) = lti.platform.scores
    assert score["timestamp"] == row.timestamp


def test_retry_waits_for_retry_after_and_backs_off(lti: LtiWorld) -> None:
    aid = _assign(lti)
    b, landing = lti.student(
        "s1", custom={"kgrade_assignment": aid}, lineitem=f"{lti.platform.url}/lineitems/1"
    )
    lti.app.config["TASKS_EAGER"] = False  # keep the passback in the queue: send it by hand
    try:
        take_quiz(b, landing, HALF)
    finally:
        lti.app.config["TASKS_EAGER"] = True
    (row,) = _rows(lti)
    lti.platform.fail_next("score", Failure(429, {"Retry-After": "42"}))
    with lti.app.app_context(), task_session() as s:
        status, wait = tasks.send(s, row.id)
        assert status == "pending" and wait == pytest.approx(42.0, abs=0.01)
        status, wait = tasks.send(s, row.id)
        assert status == "sent" and wait is None
    assert 1.0 <= tasks.backoff(1, None) <= 2.0 and 256 <= tasks.backoff(9, None) <= 512


def test_expired_token_is_fetched_again_once(lti: LtiWorld) -> None:
    aid = _assign(lti)
    b, landing = lti.student(
        "s1", custom={"kgrade_assignment": aid}, lineitem=f"{lti.platform.url}/lineitems/1"
    )
    take_quiz(b, landing, HALF)
    lti.platform.tokens.clear()  # the platform forgot every token it issued
    take_quiz(b, b.get(f"/a/{aid}"), ALL_RIGHT)
    ags = [t for t in lti.platform.token_requests if "lti-ags/scope/score" in t["scope"]]
    assert len(lti.platform.scores) == 2 and len(ags) == 2


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (Failure(404, body='{"reason": "line item deleted"}'), "line item deleted"),
        (
            Failure(403, body='{"errors": [{"message": "course not published"}]}'),
            "course not published",
        ),
        (Failure(400, body="Incorrect score received"), "Incorrect score received"),
    ],
    ids=["deleted-column", "unpublished-course", "bad-request"],
)
def test_a_refusal_is_shown_to_the_instructor_and_can_be_resent(
    lti: LtiWorld, failure: Failure, reason: str
) -> None:
    aid = _assign(lti)
    b, landing = lti.student(
        "s1", custom={"kgrade_assignment": aid}, lineitem=f"{lti.platform.url}/lineitems/1"
    )
    lti.platform.fail_next("score", failure)
    take_quiz(b, landing, HALF)
    (row,) = _rows(lti)
    assert row.status == "failed" and row.http_status == failure.status and reason in row.error
    teacher, _ = lti.instructor("t1", custom={"kgrade_assignment": aid})
    page = teacher.get(f"/a/{aid}")
    assert "refused" in text(page) and reason in text(page)
    # Fixed in the LMS: the instructor sends the grades again.
    if failure.status == 404:  # the column itself is gone
        del lti.platform.lineitems["1"]
    r = teacher.post_form(f"/a/{aid}/resend", page.get_data(as_text=True), {})
    assert r.status_code == 303
    assert [s["scoreGiven"] for s in lti.platform.scores] == [3.0]
    # A deleted column is made again (once); otherwise the same column gets the grade.
    assert len(lti.platform.lineitem_posts) == (1 if failure.status == 404 else 0)
    assert lti.platform.scores[0]["lineitem"] == ("2" if failure.status == 404 else "1")
    assert _rows(lti)[-1].status == "sent"
    assert "in the gradebook" in text(teacher.get(f"/a/{aid}"))


def test_sync_grades_command_resends_every_grade(lti: LtiWorld) -> None:
    aid = _assign(lti)
    for sub, answers in (("s1", HALF), ("s2", ALL_RIGHT)):
        b, landing = lti.student(
            sub, custom={"kgrade_assignment": aid}, lineitem=f"{lti.platform.url}/lineitems/1"
        )
        take_quiz(b, landing, answers)
    assert len(lti.platform.scores) == 2
    url = lti.app.config["DATABASE_URL"]
    result = CliRunner().invoke(main, ["lti", "sync-grades", aid, "--database-url", url])
    assert result.exit_code == 0, result.output
    assert "2 grade(s) queued" in result.output
    rows = _rows(lti)
    assert len(rows) == 4 and {r.event.split(":")[0] for r in rows[2:]} == {"sync"}
    with lti.app.app_context(), task_session() as s:  # what the lti worker does with them
        for r in rows[2:]:
            assert tasks.send(s, r.id)[0] == "sent"
    assert sorted(s["scoreGiven"] for s in lti.platform.scores[2:]) == [3.0, 6.0]


def _finish(
    lti: LtiWorld, submission_id: int, verdict: str, score: float, speedup: float | None
) -> None:
    """What a grading worker does at the end of a job: store the result, announce it."""
    result: dict[str, Any] = {
        "score": score,
        "gradable": True,
        "verdict": verdict,
        "output": "",
        "tests": [],
        "leaderboard": [{"name": "speedup", "value": speedup, "order": "desc"}] if speedup else [],
    }
    with lti.app.app_context():
        store = SubmissionStore(engine=db.engine)
        store.start_attempt(submission_id)
        assert store.save_result(submission_id, 1, result)
        tasks.grading_finished.apply(args=[submission_id])


def test_exercise_posts_pending_then_the_graded_score(lti: LtiWorld) -> None:
    aid = _assign(lti, resource="exercise:attention-merge", policy="best")
    b, page = lti.student(
        "s1", custom={"kgrade_assignment": aid}, lineitem=f"{lti.platform.url}/lineitems/1"
    )
    html = page.get_data(as_text=True)
    source = "import torch\n\ndef merge_attention(a, b, c, d):\n    return a, b\n"
    r = b.post_form(
        "/exercise/attention-merge/submit", html, {"assignment_id": aid, "source": source}
    )
    assert r.status_code == 303
    sid = int(r.headers["Location"].rsplit("/", 1)[-1])
    (pending,) = lti.platform.scores
    assert pending["activityProgress"] == "Submitted" and pending["gradingProgress"] == "Pending"
    assert "scoreGiven" not in pending and pending["scoreMaximum"] == 100.0
    _finish(lti, sid, "PASS", 0.75, 1.31)
    graded = lti.platform.scores[-1]
    assert graded["gradingProgress"] == "FullyGraded" and graded["scoreGiven"] == 75.0
    assert graded["comment"] == "PASS, 1.31x the reference"
    assert graded["timestamp"] > pending["timestamp"]
    with lti.app.app_context():
        row = db.session.execute(select(submissions).where(submissions.c.id == sid)).one()
        assert row.assignment_id == aid
    # A failing second submission keeps the best grade, and says so.
    r = b.post_form(
        "/exercise/attention-merge/submit", html, {"assignment_id": aid, "source": source}
    )
    sid2 = int(r.headers["Location"].rsplit("/", 1)[-1])
    _finish(lti, sid2, "WRONG_ANSWER", 0.0, None)
    assert lti.platform.scores[-1]["scoreGiven"] == 75.0
    assert lti.platform.scores[-1]["comment"] == "WRONG_ANSWER"


def test_instructor_runs_post_nothing(lti: LtiWorld) -> None:
    aid = _assign(lti, resource="exercise:attention-merge")
    teacher, page = lti.instructor(
        "t1", custom={"kgrade_assignment": aid}, lineitem=f"{lti.platform.url}/lineitems/1"
    )
    r = teacher.get("/exercise/attention-merge/solutions")
    form = teacher.post_form(
        "/exercise/attention-merge/solutions",
        r.get_data(as_text=True),
        {"name": "correct/dense_fp32"},
    )
    assert form.status_code in (303, 404)
    assert lti.platform.scores == []
    assert INSTRUCTOR  # the teacher launched as an instructor
