"""Instructors: grades (JSON and CSV) and regrading after the key changes."""

from __future__ import annotations

import csv
import io

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.attempts import Attempt, ResponseRecord
from tests.service.conftest import QUIZ_A, World, quiz_data


def _take(world: World, who: str, answers: dict[str, list[str]], quiz: str = "quiz-a") -> str:
    aid = world.start(quiz, who=who)["id"]
    for item, answer in answers.items():
        assert world.answer(aid, item, answer, who=who).status_code == 201
    assert world.submit(aid, who=who).status_code == 200
    return aid


def test_grades_best_and_last(world: World) -> None:
    a1 = _take(world, "alice", {"q1": ["b"], "q2": ["n2", "n4", "n6"]})  # 5
    a2 = _take(world, "alice", {"q1": ["a"]})  # 0
    b1 = _take(world, "bob", {"q3": ["f"]})  # 1
    world.start("quiz-a", who="bob")  # in progress: not graded
    r = world.get("/api/v1/quizzes/quiz-a/grades", "prof")
    assert r.status_code == 200
    body = r.get_json()
    assert body["max_score"] == 6.0 and body["scoring_policy"] == "keep_highest"
    alice, bob = body["students"]
    assert alice["student"] == "alice" and alice["attempts"] == 2
    assert (alice["best_score"], alice["best_attempt_id"]) == (5.0, a1)
    assert (alice["last_score"], alice["last_attempt_id"]) == (0.0, a2)
    assert alice["grade"] == 5.0
    assert (bob["attempts"], bob["in_progress"], bob["best_attempt_id"]) == (1, 1, b1)
    assert bob["last_score"] == 1.0


def test_grades_keep_latest_policy(world: World) -> None:
    data = world.get("/api/v1/quizzes/quiz-b/data", "prof").get_json()
    data["settings"]["scoring_policy"] = "keep_latest"
    assert world.put("/api/v1/quizzes/quiz-b", "prof", json=data).status_code == 200
    _take(world, "alice", {"x1": ["two"]}, quiz="quiz-b")
    _take(world, "alice", {"x1": ["three"]}, quiz="quiz-b")
    (row,) = world.get("/api/v1/quizzes/quiz-b/grades", "prof").get_json()["students"]
    assert row["best_score"] == 1.0 and row["grade"] == 0.0


def test_grades_csv(world: World) -> None:
    a1 = _take(world, "alice", {"q1": ["b"]})
    _take(world, "bob", {"q2": ["n2"]})
    r = world.get("/api/v1/quizzes/quiz-a/grades.csv", "prof")
    assert r.status_code == 200
    assert r.mimetype == "text/csv"
    assert r.headers["Content-Disposition"] == 'attachment; filename="quiz-a-grades.csv"'
    rows = list(csv.DictReader(io.StringIO(r.get_data(as_text=True))))
    assert [row["student"] for row in rows] == ["alice", "bob"]
    assert rows[0]["best_score"] == "2" and rows[0]["best_attempt_id"] == a1
    assert rows[0]["last_attempt_id"] == a1 and rows[0]["max_score"] == "6"
    assert rows[1]["best_score"] == "1"


def test_grades_csv_escapes_formulas(world: World) -> None:
    from service.auth import create_token
    from service.db import write_intent
    from service.extensions import db

    with world.app.app_context(), write_intent():
        world.tokens["evil"] = create_token(db.session, role="student", name="=HYPERLINK(1)")[1]
        db.session.commit()
    _take(world, "evil", {"q1": ["b"]})
    text = world.get("/api/v1/quizzes/quiz-a/grades.csv", "prof").get_data(as_text=True)
    assert "\r\n'=HYPERLINK(1)," in text


def test_grades_empty_and_unknown(world: World) -> None:
    body = world.get("/api/v1/quizzes/quiz-b/grades", "prof").get_json()
    assert body["students"] == []
    csv_text = world.get("/api/v1/quizzes/quiz-b/grades.csv", "prof").get_data(as_text=True)
    assert csv_text.startswith("student,attempts,") and csv_text.count("\r\n") == 1
    assert world.get("/api/v1/quizzes/nope/grades", "prof").status_code == 404
    assert world.get("/api/v1/quizzes/nope/grades.csv", "prof").status_code == 404


def test_regrade_after_key_change(world: World, session: Session) -> None:
    right = _take(world, "alice", {"q1": ["b"], "q3": ["f"]})  # 3
    wrong = _take(world, "bob", {"q1": ["a"], "q3": ["f"]})  # 1
    unchanged = _take(world, "bob", {"q3": ["f"]})  # 1
    # The key was wrong: "a" is the answer to q1.
    data = quiz_data(QUIZ_A)
    data["items"][0]["options"][0]["correct"] = True
    data["items"][0]["options"][1]["correct"] = False
    data["items"][0]["options"][1]["feedback"] = {"lang": "en", "text": "No", "el": "Όχι"}
    put = world.put("/api/v1/quizzes/quiz-a", "prof", json=data).get_json()
    assert put["changed_items"] == [{"id": "q1", "old_revision": 1, "new_revision": 2}]
    # Stored grades stay as graded until the regrade.
    assert world.get(f"/api/v1/attempts/{right}", "alice").get_json()["score"] == 3.0

    dry = world.post("/api/v1/quizzes/quiz-a/regrade", "prof", json={"dry_run": True}).get_json()
    assert dry["dry_run"] and dry["attempts_changed"] == 2
    assert world.get(f"/api/v1/attempts/{right}", "alice").get_json()["score"] == 3.0

    r = world.post("/api/v1/quizzes/quiz-a/regrade", "prof")
    assert r.status_code == 200
    report = r.get_json()
    assert report["attempts_checked"] == 3 and report["attempts_changed"] == 2
    assert report["quiz_revision"] == 2
    changes = {c["attempt_id"]: c for c in report["changes"]}
    assert set(changes) == {right, wrong}
    assert (changes[right]["old_score"], changes[right]["new_score"]) == (3.0, 1.0)
    assert (changes[wrong]["old_score"], changes[wrong]["new_score"]) == (1.0, 3.0)
    assert changes[right]["items"] == [
        {
            "item_id": "q1",
            "old_points": 2.0,
            "new_points": 0.0,
            "old_revision": 1,
            "new_revision": 2,
        }
    ]
    # The attempts now record the revisions they were graded against.
    session.rollback()
    attempt = session.get(Attempt, wrong)
    assert attempt is not None and attempt.item_revisions == {"q1": 2, "q2": 1, "q3": 1}
    assert attempt.quiz_revision == 2
    rec = session.execute(
        select(ResponseRecord).where(
            ResponseRecord.attempt_id == wrong, ResponseRecord.item_id == "q1"
        )
    ).scalar_one()
    assert rec.item_revision == 2 and rec.correct
    grades = world.get("/api/v1/quizzes/quiz-a/grades", "prof").get_json()["students"]
    assert {g["student"]: g["best_score"] for g in grades} == {"alice": 1.0, "bob": 3.0}
    # A second regrade finds nothing left to change.
    again = world.post("/api/v1/quizzes/quiz-a/regrade", "prof").get_json()
    assert again["attempts_changed"] == 0
    _ = unchanged


def test_regrade_reports_removed_items(world: World) -> None:
    aid = _take(world, "alice", {"q1": ["b"], "q3": ["f"]})
    data = quiz_data(QUIZ_A)
    data["items"] = data["items"][:2]  # q3 removed
    world.put("/api/v1/quizzes/quiz-a", "prof", json=data)
    report = world.post("/api/v1/quizzes/quiz-a/regrade", "prof").get_json()
    (change,) = report["changes"]
    assert change["attempt_id"] == aid
    assert (change["old_score"], change["new_score"]) == (3.0, 2.0)
    assert (change["old_max_score"], change["new_max_score"]) == (6.0, 5.0)
    assert change["items"] == [
        {
            "item_id": "q3",
            "old_points": 1.0,
            "new_points": 0.0,
            "old_revision": 1,
            "new_revision": None,
        }
    ]


def test_regrade_errors(world: World) -> None:
    assert world.post("/api/v1/quizzes/nope/regrade", "prof").status_code == 404
    r = world.post("/api/v1/quizzes/quiz-a/regrade", "prof", json={"dry_run": "maybe"})
    assert r.status_code == 422 and "dry_run" in r.get_json()["errors"]["json"]
