"""The assignments API: a course's assignments, a student's own grade, the instructor's grade
table with the roster, re-sending grades, and scoping."""

from __future__ import annotations

from service.core import assignments, people
from service.db import write_intent
from service.extensions import db
from tests.service.conftest import World


def _assignment(world: World, **form: str) -> str:
    with world.app.app_context(), write_intent():
        course = people.default_course(db.session)
        spec = assignments.parse_spec(db.session, {"resource": "quiz:quiz-a", **form})
        a = assignments.create(db.session, course.id, spec, None)
        db.session.commit()
        return a.id


def test_assignment_attempts_grades_and_resend(world: World) -> None:
    aid = _assignment(world, attempts="1", policy="best", title="Week 1")
    r = world.post("/api/v1/quizzes/quiz-a/attempts", "alice", json={"assignment_id": aid})
    assert r.status_code == 201, r.get_json()
    attempt = r.get_json()
    assert attempt["assignment_id"] == aid and attempt["allowed_attempts"] == 1
    world.answer(attempt["id"], "q1", ["b"])
    assert world.submit(attempt["id"]).status_code == 200
    # The assignment's own limit (1), not the quiz's (2).
    again = world.post("/api/v1/quizzes/quiz-a/attempts", "alice", json={"assignment_id": aid})
    assert again.status_code == 409 and "1 of 1" in again.get_json()["message"]
    mine = world.get("/api/v1/assignments", "alice").get_json()
    assert [(a["title"], a["my_grade"]) for a in mine] == [("Week 1", 2.0)]
    table = world.get(f"/api/v1/assignments/{aid}/grades", "prof").get_json()
    rows = {r["student"]: r for r in table["students"]}
    assert rows["alice"]["grade"] == 2.0 and rows["alice"]["submitted"] is True
    assert rows["bob"]["submitted"] is False  # on the roster, not submitted
    assert "prof" not in rows  # instructors are not graded
    assert world.get(f"/api/v1/assignments/{aid}/grades", "alice").status_code == 403
    # A stand-alone course has no LMS to send to.
    r = world.post(f"/api/v1/assignments/{aid}/resend", "prof")
    assert r.status_code == 200 and r.get_json() == {"queued": 0}


def test_unknown_or_mismatched_assignment(world: World) -> None:
    aid = _assignment(world)
    r = world.get("/api/v1/assignments/0123456789abcdef0123456789abcdef/grades", "prof")
    assert r.status_code == 404 and "assignment_id" in r.get_json()["message"]
    r = world.post("/api/v1/quizzes/quiz-b/attempts", "alice", json={"assignment_id": aid})
    assert r.status_code == 422 and "assignment_id" in r.get_json()["message"]
