"""Quizzes: the student view hides the key, instructors create/update with revision bumps."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from item_bank import load_quiz
from tests.service.conftest import QUIZ_A, QUIZ_B, World, quiz_data

KEY_FIELDS = {"correct", "feedback", "explanation", "correct_options"}


def _keys(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in _keys(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in _keys(v)}
    return set()


def test_list_quizzes(world: World) -> None:
    world.start("quiz-a")
    r = world.get("/api/v1/quizzes", "alice")
    assert r.status_code == 200
    rows = {q["id"]: q for q in r.get_json()}
    assert set(rows) == {"quiz-a", "quiz-b"}
    assert rows["quiz-a"]["title"] == "Quiz A"
    assert rows["quiz-a"]["item_count"] == 3 and rows["quiz-a"]["points_possible"] == 6.0
    assert rows["quiz-a"]["attempts_used"] == 1 and rows["quiz-b"]["attempts_used"] == 0
    assert rows["quiz-a"]["settings"]["allowed_attempts"] == 2
    src = {q["id"]: q for q in world.get("/api/v1/quizzes?lang=source", "alice").get_json()}
    assert src["quiz-a"]["title"] == "Κουίζ Α"
    assert "attempts_used" not in world.get("/api/v1/quizzes", "prof").get_json()[0]


def test_student_view_has_no_key(world: World) -> None:
    for lang in ("en", "source"):
        r = world.get(f"/api/v1/quizzes/quiz-a?lang={lang}", "alice")
        assert r.status_code == 200
        body = r.get_json()
        assert not (_keys(body) & KEY_FIELDS), lang
        text = json.dumps(body, ensure_ascii=False)
        for secret in ("Because B", "Επειδή", "B is right", "2 is even", "It is blue"):
            assert secret not in text


def test_student_view_languages(world: World) -> None:
    en = world.get("/api/v1/quizzes/quiz-a?lang=en", "alice").get_json()
    src = world.get("/api/v1/quizzes/quiz-a?lang=source", "alice").get_json()
    assert en["lang"] == "en" and src["lang"] == "source"
    assert en["items"][0]["prompt"] == "Question one"
    assert src["items"][0]["prompt"] == "Ερώτηση ένα"
    # An English seed string stays verbatim in the source view.
    assert src["items"][1]["prompt"] == "Pick the even numbers"
    assert [o["id"] for o in en["items"][0]["options"]] == ["a", "b", "c"]


def test_instructor_view_has_the_key(world: World) -> None:
    body = world.get("/api/v1/quizzes/quiz-a?lang=source", "prof").get_json()
    q1 = body["items"][0]
    assert q1["correct_options"] == ["b"]
    assert q1["explanation"] == "Επειδή B."
    assert q1["options"][0] == {
        "id": "a",
        "text": "Alpha",
        "correct": False,
        "feedback": "[el] A is wrong",
    }


def test_unknown_quiz_and_bad_lang(world: World) -> None:
    r = world.get("/api/v1/quizzes/nope", "alice")
    assert r.status_code == 404
    assert r.get_json()["errors"] == {"path": {"quiz_id": ["unknown quiz 'nope'"]}}
    r = world.get("/api/v1/quizzes/quiz-a?lang=fr", "alice")
    assert r.status_code == 422
    assert "lang" in r.get_json()["errors"]["query"]


def test_create_quiz(world: World) -> None:
    data = quiz_data(QUIZ_B, id="quiz-c")
    r = world.post("/api/v1/quizzes", "prof", json=data)
    assert r.status_code == 201, r.get_json()
    body = r.get_json()
    assert body["created"] and body["revision"] == 1
    assert r.headers["Location"].endswith("/api/v1/quizzes/quiz-c")
    assert body["quiz"]["items"][0]["revision"] == 1
    assert world.get("/api/v1/quizzes/quiz-c", "alice").status_code == 200
    # Same schema as the bank: the stored quiz round-trips through load_quiz.
    stored = world.get("/api/v1/quizzes/quiz-c/data", "prof").get_json()
    assert load_quiz(stored).id == "quiz-c"


def test_create_existing_quiz_is_409(world: World) -> None:
    r = world.post("/api/v1/quizzes", "prof", json=QUIZ_A)
    assert r.status_code == 409
    assert "id" in r.get_json()["errors"]["json"]


def test_create_invalid_quiz_names_the_fields(world: World) -> None:
    data = quiz_data(QUIZ_B, id="quiz-c")
    del data["items"][0]["options"][1]["feedback"]  # a wrong option needs feedback
    data["items"][1]["points"] = -1
    r = world.post("/api/v1/quizzes", "prof", json=data)
    assert r.status_code == 422
    errors = r.get_json()["errors"]["json"]
    assert "items.1.points" in errors
    r = world.post("/api/v1/quizzes", "prof", json=quiz_data(QUIZ_B, id="quiz-c", items=[]))
    assert r.status_code == 422 and "items" in r.get_json()["errors"]["json"]
    data = quiz_data(QUIZ_B, id="quiz-c")
    del data["items"][0]["options"][1]["feedback"]
    r = world.post("/api/v1/quizzes", "prof", json=data)
    assert r.status_code == 422
    assert "items.0.options.1.feedback" in r.get_json()["errors"]["json"]
    assert world.get("/api/v1/quizzes/quiz-c", "prof").status_code == 404


def test_update_bumps_only_changed_items(world: World) -> None:
    data = quiz_data(QUIZ_A)
    data["items"][0]["options"][0]["correct"] = True  # q1: a and b correct -> multiple_answers
    data["items"][0]["type"] = "multiple_answers"
    data["items"][2]["explanation"]["text"] = "Blue, by Rayleigh scattering."
    r = world.put("/api/v1/quizzes/quiz-a", "prof", json=data)
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert body["previous_revision"] == 1 and body["revision"] == 2
    assert body["changed_items"] == [
        {"id": "q1", "old_revision": 1, "new_revision": 2},
        {"id": "q3", "old_revision": 1, "new_revision": 2},
    ]
    revs = {i["id"]: i["revision"] for i in body["quiz"]["items"]}
    assert revs == {"q1": 2, "q2": 1, "q3": 2}
    # Same body again: nothing changes, nothing is bumped.
    again = world.put("/api/v1/quizzes/quiz-a", "prof", json=data).get_json()
    assert again["revision"] == 2 and again["changed_items"] == []


def test_update_add_remove_and_readd_items(world: World) -> None:
    data = quiz_data(QUIZ_B)
    removed = data["items"].pop()
    body = world.put("/api/v1/quizzes/quiz-b", "prof", json=data).get_json()
    assert body["removed_items"] == ["x2"] and body["revision"] == 2
    changed = copy.deepcopy(removed)
    changed["prompt"]["text"] = "Two plus two, again?"
    data["items"].append(changed)
    body = world.put("/api/v1/quizzes/quiz-b", "prof", json=data).get_json()
    assert body["added_items"] == ["x2"]
    # The re-added item continues its own revision history instead of reusing revision 1.
    assert {i["id"]: i["revision"] for i in body["quiz"]["items"]}["x2"] == 2


def test_update_id_mismatch_and_unknown_quiz(world: World) -> None:
    r = world.put("/api/v1/quizzes/quiz-a", "prof", json=quiz_data(QUIZ_A, id="other"))
    assert r.status_code == 422 and "id" in r.get_json()["errors"]["json"]
    data = quiz_data(QUIZ_A)
    del data["id"]
    assert world.put("/api/v1/quizzes/quiz-a", "prof", json=data).status_code == 200
    r = world.put("/api/v1/quizzes/zzz", "prof", json=quiz_data(QUIZ_A, id="zzz"))
    assert r.status_code == 404


def test_quiz_data_for_instructors(world: World) -> None:
    data = world.get("/api/v1/quizzes/quiz-a/data", "prof").get_json()
    assert data["items"][0]["options"][1]["correct"] is True
    assert data["items"][0]["options"][0]["feedback"] == {
        "lang": "en",
        "text": "A is wrong",
        "el": "[el] A is wrong",
    }
    assert world.get("/api/v1/quizzes/nope/data", "prof").status_code == 404


# ---- export -------------------------------------------------------------------------------

exports = pytest.importorskip("service.exports")


@pytest.mark.parametrize(
    ("fmt", "lang"), [("qti12", "en"), ("moodle-xml", "source"), ("imscc", "all")]
)
def test_export_matches_the_library(world: World, fmt: str, lang: str) -> None:
    r = world.get(f"/api/v1/quizzes/quiz-a/export?format={fmt}&lang={lang}", "prof")
    assert r.status_code == 200, r.get_json() if r.is_json else r.status
    expected = exports.export_quiz(load_quiz(copy.deepcopy(QUIZ_A)), fmt, lang)
    assert r.data == expected.data
    assert r.mimetype == expected.media_type
    assert r.headers["Content-Disposition"] == f'attachment; filename="{expected.filename}"'


def test_export_of_a_bank_quiz_matches_the_cli(world: World, tmp_path: Any) -> None:
    from click.testing import CliRunner

    from item_bank import all_quizzes
    from service.cli import main
    from service.extensions import db
    from service.quizzes_store import sync_bank

    with world.app.app_context():
        sync_bank(db.session, all_quizzes())
        db.session.commit()
    quiz_id = all_quizzes()[0].id
    out = tmp_path / "out.zip"
    result = CliRunner().invoke(
        main, ["export", quiz_id, "--format", "qti12", "--lang", "source", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    r = world.get(f"/api/v1/quizzes/{quiz_id}/export?format=qti12&lang=source", "prof")
    assert r.status_code == 200
    assert r.data == out.read_bytes()


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("format=pdf", "format"),
        ("format=qti12&lang=fr", "lang"),
        ("", "format"),
        ("format=imscc&mlang=x", "mlang"),
    ],
)
def test_export_bad_query(world: World, query: str, field: str) -> None:
    r = world.get(f"/api/v1/quizzes/quiz-a/export?{query}", "prof")
    assert r.status_code == 422
    assert field in r.get_json()["errors"]["query"]


def test_export_unknown_quiz(world: World) -> None:
    assert world.get("/api/v1/quizzes/nope/export?format=qti12", "prof").status_code == 404
