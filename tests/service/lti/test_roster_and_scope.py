"""Names and Roles (the roster in the grade table, who has not submitted) and course scoping:
a student of one course never sees another course's attempts, submissions or leaderboard,
through the pages or the API."""

from __future__ import annotations

import re

from sqlalchemy import select

from service.auth import create_token
from service.core import people
from service.core.tasks import task_session
from service.db import write_intent
from service.db.courses import Course, Membership
from service.extensions import db
from service.lti import tasks
from tests.service.conftest import World
from tests.service.lti.conftest import LtiWorld, content_item, take_quiz, text
from tests.service.lti.platform import INSTRUCTOR, LEARNER, Failure, member


def _course_id(lti: LtiWorld, context: str) -> int:
    with lti.app.app_context():
        return db.session.execute(
            select(Course.id).where(Course.context_id == context)
        ).scalar_one()


def test_roster_is_read_page_by_page_and_shows_who_has_not_submitted(lti: LtiWorld) -> None:
    lti.platform.members = [
        member("t1", INSTRUCTOR),
        member("s1"),
        member("s2"),
        member("s3", status="Inactive"),
        member("s4"),
    ]
    claims = lti.deep_link(lti.browser(), resource="quiz:quiz-a")
    aid = content_item(claims)["custom"]["kgrade_assignment"]
    b, landing = lti.student(
        "s1", custom={"kgrade_assignment": aid}, lineitem=f"{lti.platform.url}/lineitems/1"
    )
    take_quiz(b, landing, {"q1": ["b"]})
    # The instructor's launch refreshes the roster (NRPS, two members per page here).
    teacher, _ = lti.instructor("t1", custom={"kgrade_assignment": aid})
    page = text(teacher.get(f"/a/{aid}"))
    for name in ("Person s1", "Person s2", "Person s3", "Person s4"):
        assert name in page
    assert page.count("not yet") == 3 and "inactive" in page
    assert "Person t1" not in page.split("Grades")[1].split("</table>")[0]  # staff are not graded
    csv = teacher.get(f"/a/{aid}/grades.csv").get_data(as_text=True).splitlines()
    assert csv[0].startswith("student,email,roster_status,submitted")
    assert len(csv) == 5 and any(line.startswith("Person s1,") and ",yes," in line for line in csv)
    with lti.app.app_context():
        roles = dict(
            db.session.execute(
                select(Membership.user_id, Membership.source).where(
                    Membership.course_id == _course_id(lti, "ctx-1")
                )
            ).all()
        )
        assert len(roles) == 5


def test_a_failing_roster_read_is_shown(lti: LtiWorld) -> None:
    lti.platform.fail_next("members", Failure(403, body='{"reason": "NRPS disabled"}'))
    teacher, _ = lti.instructor("t1")
    page = text(teacher.get("/course"))
    assert "last try failed" in page and "NRPS disabled" in page
    # A transient error is retried by the task.
    lti.platform.members = [member("s9")]
    lti.platform.fail_next("members", Failure(503))
    with lti.app.app_context(), task_session() as s:
        try:
            tasks.sync_roster(s, _course_id(lti, "ctx-1"))
        except Exception as exc:  # noqa: BLE001
            assert "503" in str(exc)
        assert tasks.sync_roster(s, _course_id(lti, "ctx-1")) == 1


def test_courses_do_not_see_each_other(lti: LtiWorld) -> None:
    claims = lti.deep_link(lti.browser(), resource="quiz:quiz-b")
    aid = content_item(claims)["custom"]["kgrade_assignment"]
    a_student, landing = lti.student("s1", custom={"kgrade_assignment": aid})
    review = take_quiz(a_student, landing, {"x1": ["two"]})
    attempt_url = a_student.page_url.split("?")[0]
    html = landing.get_data(as_text=True)
    r = a_student.post_form(
        "/exercise/attention-merge/submit",
        html,
        {"source": "def merge_attention(a, b, c, d):\n    return a, b\n"},
    )
    submission_url = r.headers["Location"]
    assert review.status_code == 200
    # A student of another course (another LMS context) reaches none of it.
    other, _ = lti.student("s2", context="ctx-2")
    for url in (attempt_url, submission_url, f"/a/{aid}", f"{submission_url}/status.json"):
        assert other.get(url).status_code == 404, url
    # A student of the same course reaches the assignment but not another's work.
    peer, _ = lti.student("s3", custom={"kgrade_assignment": aid})
    assert peer.get(f"/a/{aid}").status_code == 200
    assert peer.get(attempt_url).status_code == 403 and peer.get(submission_url).status_code == 403
    # An instructor of the other course neither.
    other_teacher, _ = lti.instructor("t2", context="ctx-2")
    assert other_teacher.get(f"/a/{aid}").status_code == 404
    assert other_teacher.get(attempt_url).status_code == 404


def test_tokens_are_scoped_to_their_course(lti: LtiWorld, world: World) -> None:
    """The bearer-token API keeps working, scoped the same way."""
    with lti.app.app_context(), write_intent():
        other = people.create_local_course(db.session, "other", "Another course")
        outsider = create_token(db.session, role="student", name="olga", course=other)[1]
        outsider_prof = create_token(db.session, role="instructor", name="oprof", course=other)[1]
        db.session.commit()
    c = lti.app.test_client()
    alice = world.h("alice")
    r = c.post("/api/v1/quizzes/quiz-b/attempts", json={"lang": "en"}, headers=alice)
    assert r.status_code == 201
    attempt = r.get_json()["id"]
    for who in (outsider, outsider_prof):
        h = {"Authorization": f"Bearer {who}"}
        assert c.get(f"/api/v1/attempts/{attempt}", headers=h).status_code == 404
    prof = {"Authorization": f"Bearer {outsider_prof}"}
    grades = c.get("/api/v1/quizzes/quiz-b/grades", headers=prof).get_json()
    assert grades["students"] == []  # alice is in the default course, not "other"
    # An LMS course's assignment is not reachable with a default-course token either.
    claims = lti.deep_link(lti.browser(), resource="quiz:quiz-b")
    aid = content_item(claims)["custom"]["kgrade_assignment"]
    r = c.post("/api/v1/quizzes/quiz-b/attempts", json={"assignment_id": aid}, headers=alice)
    assert r.status_code == 404 and "assignment_id" in r.get_json()["message"]


def test_learner_roles_cannot_open_instructor_pages(lti: LtiWorld) -> None:
    b, _ = lti.student("s1")
    for url in ("/course", "/exercise/attention-merge/solutions"):
        r = b.get(url)
        assert r.status_code == 403 and "for instructors" in text(r)
    assert re.search(r"Person s1 \(student\)", text(b.get("/")))
    assert LEARNER
