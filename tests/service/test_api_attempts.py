"""Taking a quiz: attempts, immediate feedback, submit, limits and Idempotency-Key."""

from __future__ import annotations

import dataclasses
import re
import threading
from datetime import timedelta
from typing import Any

import pytest
from flask import g
from flask.testing import FlaskClient
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from item_bank import load_quiz
from service.core.views import option_order
from service.db.attempts import Attempt, IdempotencyRecord, ResponseRecord
from tests.service.conftest import QUIZ_A, World, quiz_data


def _count(session: Session, model: Any) -> int:
    session.rollback()  # a fresh snapshot: see what the requests committed since the last look
    return session.execute(select(func.count()).select_from(model)).scalar_one()


def test_start_attempt(world: World) -> None:
    r = world.post("/api/v1/quizzes/quiz-a/attempts", "alice", json={"lang": "source"})
    assert r.status_code == 201
    body = r.get_json()
    assert r.headers["Location"] == f"/api/v1/attempts/{body['id']}"
    assert body["status"] == "in_progress" and body["number"] == 1
    assert body["allowed_attempts"] == 2 and body["lang"] == "source"
    assert body["student"] == "alice" and body["quiz_revision"] == 1
    assert body["item_revisions"] == {"q1": 1, "q2": 1, "q3": 1}
    assert [i["id"] for i in body["items"]] == ["q1", "q2", "q3"]
    assert body["items"][0]["prompt"] == "Ερώτηση ένα"
    for item in body["items"]:
        assert item["response"] is None
        assert "explanation" not in item and "correct_options" not in item
        assert all(set(o) == {"id", "text"} for o in item["options"])


def test_start_attempt_without_body_defaults_to_english(world: World) -> None:
    r = world.client.post("/api/v1/quizzes/quiz-a/attempts", headers=world.h("alice"))
    assert r.status_code == 201
    assert r.get_json()["lang"] == "en"


def test_start_attempt_unknown_quiz_and_bad_lang(world: World) -> None:
    assert world.post("/api/v1/quizzes/nope/attempts", "alice", json={}).status_code == 404
    r = world.post("/api/v1/quizzes/quiz-a/attempts", "alice", json={"lang": "de"})
    assert r.status_code == 422 and "lang" in r.get_json()["errors"]["json"]


def test_answer_gives_immediate_feedback_in_the_attempts_language(world: World) -> None:
    attempt = world.start("quiz-a", lang="source")
    r = world.answer(attempt["id"], "q1", ["a"])
    assert r.status_code == 201
    fb = r.get_json()
    assert fb["correct"] is False and fb["points"] == 0.0 and fb["max_points"] == 2.0
    assert fb["correct_options"] == ["b"]
    assert fb["explanation"] == "Επειδή B."
    assert fb["option_feedback"] == [
        {"option_id": "a", "correct": False, "feedback": "[el] A is wrong"}
    ]
    assert fb["item_revision"] == 1 and fb["times_answered"] == 1 and fb["can_reanswer"] is False

    r = world.answer(attempt["id"], "q2", ["n2", "n3", "n4"])
    fb = r.get_json()
    assert fb["points"] == 1.0 and fb["correct"] is False
    assert [f["option_id"] for f in fb["option_feedback"]] == ["n2", "n3", "n4"]
    assert fb["option_feedback"][1]["feedback"] == "[el] 3 is odd"

    en = world.start("quiz-a", who="bob", lang="en")
    fb = world.answer(en["id"], "q3", ["f"], who="bob").get_json()
    assert fb["correct"] and fb["explanation"] == "The sky is blue."
    assert fb["option_feedback"] == [{"option_id": "f", "correct": True, "feedback": None}]


def test_attempt_view_reveals_only_answered_items(world: World) -> None:
    attempt = world.start("quiz-a")
    world.answer(attempt["id"], "q1", ["b"])
    body = world.get(f"/api/v1/attempts/{attempt['id']}", "alice").get_json()
    q1, q2, q3 = body["items"]
    assert q1["response"]["correct"] and q1["response"]["explanation"] == "Because B."
    assert q2["response"] is None and q3["response"] is None
    assert "explanation" not in q2 and "correct_options" not in q2
    assert world.get("/api/v1/attempts/nope", "alice").status_code == 404


def test_answering_twice_is_409_unless_reanswer(world: World, session: Session) -> None:
    attempt = world.start("quiz-a")
    assert world.answer(attempt["id"], "q1", ["a"]).status_code == 201
    r = world.answer(attempt["id"], "q1", ["b"])
    assert r.status_code == 409 and "already answered" in r.get_json()["message"]
    stored = session.execute(select(ResponseRecord)).scalar_one()
    assert stored.answer == ["a"] and stored.points == 0.0

    b = world.start("quiz-b")
    assert world.answer(b["id"], "x1", ["three"]).status_code == 201
    r = world.answer(b["id"], "x1", ["two"])
    assert r.status_code == 200
    assert r.get_json()["times_answered"] == 2 and r.get_json()["correct"]
    assert r.get_json()["can_reanswer"] is True


def test_bad_answers_are_422_naming_the_field(world: World, session: Session) -> None:
    aid = world.start("quiz-a")["id"]
    cases = [
        ({"item_id": "zz", "answer": ["a"]}, "item_id"),
        ({"item_id": "q1", "answer": ["z"]}, "answer"),
        ({"item_id": "q1", "answer": ["a", "b"]}, "answer"),
        ({"item_id": "q1", "answer": []}, "answer"),
        ({"item_id": "q1", "answer": "b"}, "answer"),
        ({"item_id": "q1", "answer": [1]}, "answer"),
        ({"item_id": 5, "answer": ["b"]}, "item_id"),
        ({"answer": ["b"]}, "item_id"),
        ({"item_id": "q1"}, "answer"),
        ({"item_id": "q1", "answer": ["b"], "extra": 1}, "extra"),
    ]
    for body, field in cases:
        r = world.post(f"/api/v1/attempts/{aid}/responses", "alice", json=body)
        assert r.status_code == 422, body
        assert field in r.get_json()["errors"]["json"], (body, r.get_json())
    assert _count(session, ResponseRecord) == 0


def test_submit_scores_with_partial_credit(world: World) -> None:
    aid = world.start("quiz-a")["id"]
    world.answer(aid, "q1", ["b"])
    world.answer(aid, "q2", ["n2", "n4", "n5"])  # 2 right - 1 wrong = 1/3 of 3 points
    r = world.submit(aid)
    assert r.status_code == 200
    body = r.get_json()
    assert body["score"] == 3.0 and body["max_score"] == 6.0
    assert body["status"] == "submitted" and body["number"] == 1
    items = {i["item_id"]: i for i in body["items"]}
    assert items["q1"] == {
        "item_id": "q1", "revision": 1, "answered": True, "answer": ["b"],
        "correct": True, "points": 2.0, "max_points": 2.0,
    }  # fmt: skip
    assert items["q2"]["points"] == 1.0 and not items["q2"]["correct"]
    assert items["q3"]["answered"] is False and items["q3"]["points"] == 0.0
    view = world.get(f"/api/v1/attempts/{aid}", "alice").get_json()
    assert view["status"] == "submitted" and view["score"] == 3.0


def test_submit_twice_and_answer_after_submit_are_409(world: World) -> None:
    aid = world.start("quiz-a")["id"]
    assert world.submit(aid).status_code == 200
    r = world.submit(aid)
    assert r.status_code == 409 and "already submitted" in r.get_json()["message"]
    assert world.answer(aid, "q1", ["b"]).status_code == 409
    assert world.submit("nope").status_code == 404


def test_attempt_limit_is_enforced(world: World, session: Session) -> None:
    world.start("quiz-a")
    world.start("quiz-a")
    r = world.post("/api/v1/quizzes/quiz-a/attempts", "alice", json={})
    assert r.status_code == 409 and "attempt limit" in r.get_json()["message"]
    assert world.start("quiz-a", who="bob")["number"] == 1  # per student
    assert _count(session, Attempt) == 3
    for _ in range(3):
        world.start("quiz-b")  # unlimited


def test_attempt_limit_holds_under_concurrent_starts(world: World, session: Session) -> None:
    statuses: list[int] = []
    barrier = threading.Barrier(6)

    def start() -> None:
        client = world.app.test_client()
        barrier.wait()
        r = client.post("/api/v1/quizzes/quiz-a/attempts", headers=world.h("alice"), json={})
        statuses.append(r.status_code)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [201, 201, 409, 409, 409, 409]
    numbers = session.execute(select(Attempt.number)).scalars().all()
    assert sorted(numbers) == [1, 2]


def test_concurrent_double_answer_stores_one_response(world: World, session: Session) -> None:
    aid = world.start("quiz-a")["id"]
    statuses: list[int] = []
    barrier = threading.Barrier(4)

    def answer(option: str) -> None:
        client = world.app.test_client()
        barrier.wait()
        r = client.post(
            f"/api/v1/attempts/{aid}/responses",
            headers=world.h("alice"),
            json={"item_id": "q1", "answer": [option]},
        )
        statuses.append(r.status_code)

    threads = [threading.Thread(target=answer, args=(o,)) for o in "abca"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [201, 409, 409, 409]
    assert _count(session, ResponseRecord) == 1


def _race_before_lock(world: World, monkeypatch: Any, racer: Any) -> list[Any]:
    """Run ``racer`` (another request) once, between an answer's checks and its write (SQLite:
    before the write lock; PostgreSQL: the write is the guarded statement itself)."""
    from service.core import attempts as core_attempts

    real, raced, started = core_attempts.begin_writing, [], []

    def racing(session: Session) -> bool:
        if not started:  # the racer's own answer passes through here too: let it by
            started.append(True)
            # another thread: a request of its own (this thread's would share this session)
            t = threading.Thread(target=lambda: raced.append(racer(world.app.test_client())))
            t.start()
            t.join()
        return real(session)

    monkeypatch.setattr(core_attempts, "begin_writing", racing)
    return raced


def test_answer_checks_again_once_it_holds_the_lock(
    world: World, session: Session, monkeypatch: Any
) -> None:
    aid = world.start("quiz-a")["id"]
    url = f"/api/v1/attempts/{aid}/responses"
    raced = _race_before_lock(
        world,
        monkeypatch,
        lambda c: c.post(url, headers=world.h("alice"), json={"item_id": "q1", "answer": ["b"]}),
    )
    r = world.answer(aid, "q1", ["a"])
    assert raced[0].status_code == 201  # the other request answered q1 first
    assert r.status_code == 409 and "already answered" in r.get_json()["message"]
    assert _count(session, ResponseRecord) == 1
    stored = session.execute(select(ResponseRecord.answer)).scalar_one()
    assert stored == ["b"]


@pytest.mark.parametrize("first", [None, ["three"]], ids=["answer", "reanswer"])
def test_answer_refused_when_the_attempt_is_submitted_before_its_write(
    world: World, session: Session, monkeypatch: Any, first: list[str] | None
) -> None:
    """A first answer's insert and a re-answer's replacement are both guarded."""
    aid = world.start("quiz-b")["id"]
    if first is not None:
        assert world.answer(aid, "x1", first).status_code == 201
    raced = _race_before_lock(
        world,
        monkeypatch,
        lambda c: c.post(f"/api/v1/attempts/{aid}/submit", headers=world.h("alice")),
    )
    r = world.answer(aid, "x1", ["two"])
    assert raced[0].status_code == 200
    assert r.status_code == 409 and "already submitted" in r.get_json()["message"]
    stored = session.execute(select(ResponseRecord.answer, ResponseRecord.times_answered)).all()
    assert [tuple(row) for row in stored] == ([] if first is None else [(first, 1)])


def test_reanswer_raced_by_another_reanswer_lands_after_it(
    world: World, session: Session, monkeypatch: Any
) -> None:
    """A replacement whose read was overtaken by another one reads again and replaces that."""
    aid = world.start("quiz-b")["id"]
    url = f"/api/v1/attempts/{aid}/responses"
    assert world.answer(aid, "x1", ["three"]).status_code == 201
    raced = _race_before_lock(
        world,
        monkeypatch,
        lambda c: c.post(url, headers=world.h("alice"), json={"item_id": "x1", "answer": ["two"]}),
    )
    r = world.answer(aid, "x1", ["three"])
    assert raced[0].status_code == 200 and raced[0].get_json()["times_answered"] == 2
    assert r.status_code == 200 and r.get_json()["times_answered"] == 3
    stored = session.execute(select(ResponseRecord)).scalar_one()
    assert stored.answer == ["three"] and stored.times_answered == 3


def test_answer_runs_without_a_transaction_on_postgres_unless_keyed(
    world: World, monkeypatch: Any
) -> None:
    """PostgreSQL: an answer without an Idempotency-Key runs in autocommit (no BEGIN or
    COMMIT round trips); with a key, in a transaction (the stored reply commits with it);
    the pooled connection is back in transactions for the next request. SQLite: always in a
    transaction."""
    from service.core import attempts as core_attempts

    seen: list[tuple[str, bool]] = []
    real_store, real_submit = core_attempts._store, core_attempts.submit

    def mode(session: Any) -> bool:
        return bool(session.connection().connection.dbapi_connection.autocommit)

    def store(session: Any, *args: Any) -> Any:
        # once a request: a re-answer's first write (an insert that finds the item answered,
        # attempts.ANSWER_READ) is followed by its replacement
        if not g.get("stored"):
            g.stored = True
            seen.append(("answer", mode(session)) if _postgres(world) else ("answer", False))
        return real_store(session, *args)

    def submit(session: Any, *args: Any) -> Any:
        seen.append(("submit", mode(session)) if _postgres(world) else ("submit", False))
        return real_submit(session, *args)

    monkeypatch.setattr(core_attempts, "_store", store)
    monkeypatch.setattr(core_attempts, "submit", submit)
    aid = world.start("quiz-b")["id"]
    assert world.answer(aid, "x1", ["three"]).status_code == 201
    keyed = {"Idempotency-Key": "x1-again"}
    body = {"item_id": "x1", "answer": ["two"]}
    url = f"/api/v1/attempts/{aid}/responses"
    assert world.post(url, "alice", json=body, headers=keyed).status_code == 200
    assert world.post(f"/api/v1/attempts/{aid}/submit", "alice").status_code == 200
    pg = _postgres(world)
    assert seen == [("answer", pg), ("answer", False), ("submit", False)]


def _postgres(world: World) -> bool:
    return world.app.config["DATABASE_URL"].startswith("postgresql")


def test_answer_waits_for_the_attempts_lock(world: World, session: Session) -> None:
    """PostgreSQL: a submit holds the attempt's row lock; an answer meanwhile waits for it and
    then sees the attempt submitted. (SQLite: the writer lock, tests above.)"""
    if not _postgres(world):
        pytest.skip("PostgreSQL's row lock")
    aid = world.start("quiz-a")["id"]
    session.execute(select(Attempt.id).where(Attempt.id == aid).with_for_update())
    session.execute(update(Attempt).where(Attempt.id == aid).values(status="submitted"))
    answered: list[Any] = []
    client = world.app.test_client()
    url = f"/api/v1/attempts/{aid}/responses"
    body = {"item_id": "q1", "answer": ["b"]}
    t = threading.Thread(
        target=lambda: answered.append(client.post(url, headers=world.h("alice"), json=body))
    )
    t.start()
    t.join(0.5)
    assert t.is_alive() and not answered  # waiting for the lock
    session.commit()
    t.join(10)
    assert answered[0].status_code == 409
    assert "already submitted" in answered[0].get_json()["message"]
    assert _count(session, ResponseRecord) == 0


def test_time_limit(world: World, session: Session) -> None:
    world.put("/api/v1/quizzes/quiz-b", "prof", json=quiz_data(
        world.get("/api/v1/quizzes/quiz-b/data", "prof").get_json(),
        settings={"allow_reanswer": True, "time_limit_minutes": 5},
    ))  # fmt: skip
    attempt = world.start("quiz-b")
    assert attempt["deadline"] is not None
    assert world.answer(attempt["id"], "x1", ["two"]).status_code == 201
    started = session.get(Attempt, attempt["id"]).started_at  # type: ignore[union-attr]
    session.execute(
        update(Attempt)
        .where(Attempt.id == attempt["id"])
        .values(started_at=started - timedelta(minutes=6))
    )
    session.commit()
    r = world.answer(attempt["id"], "x2", ["four"])
    assert r.status_code == 409 and "time limit" in r.get_json()["message"]
    assert world.submit(attempt["id"]).get_json()["score"] == 1.0


def _options(view: dict[str, Any], item_id: str) -> list[str]:
    item = next(i for i in view["items"] if i["id"] == item_id)
    return [o["id"] for o in item["options"]]


def _shuffle_quiz(world: World, quiz_id: str, shuffle: bool, fixed: tuple[str, ...] = ()) -> None:
    """Quiz A with unlimited attempts, shuffled or not; ``fixed`` items keep their order."""
    data = quiz_data(
        QUIZ_A, id=quiz_id, settings={"allowed_attempts": None, "shuffle_answers": shuffle}
    )
    for item in data["items"]:
        if item["id"] in fixed:
            item["shuffle"] = False
    assert world.post("/api/v1/quizzes", "prof", json=data).status_code == 201


WRITTEN = {"q1": ["a", "b", "c"], "q2": ["n2", "n3", "n4", "n5", "n6"], "q3": ["t", "f"]}


def test_option_order_is_seeded_per_attempt_and_item() -> None:
    quiz = load_quiz(quiz_data(QUIZ_A), source="test")
    q2 = quiz.item("q2")
    seeds = [f"{n:032x}" for n in range(20)]
    orders = [tuple(option_order(q2, seed)) for seed in seeds]
    assert orders == [tuple(option_order(q2, seed)) for seed in seeds]  # same seed, same order
    assert all(sorted(o) == list(range(5)) for o in orders)
    assert len(set(orders)) > 1  # different attempts, different orders
    assert option_order(q2, None) == list(range(5))  # the quiz does not shuffle
    fixed = dataclasses.replace(q2, shuffle=False)
    assert {tuple(option_order(fixed, seed)) for seed in seeds} == {tuple(range(5))}


def test_shuffled_options_are_stable_per_attempt_and_differ_between_attempts(world: World) -> None:
    _shuffle_quiz(world, "quiz-s", shuffle=True)
    orders = set()
    for _ in range(6):
        attempt = world.start("quiz-s")
        order = _options(attempt, "q2")
        for _ in range(2):  # a reload shows the same order
            again = world.get(f"/api/v1/attempts/{attempt['id']}", "alice").get_json()
            assert _options(again, "q2") == order
        assert sorted(order) == sorted(WRITTEN["q2"])
        orders.add(tuple(order))
    # 6 attempts of a 5-option item all in one order: 1 in 120**5 if shuffling works
    assert len(orders) > 1


def test_shuffled_attempts_are_graded_by_option_id(world: World) -> None:
    _shuffle_quiz(world, "quiz-s", shuffle=True)
    layouts = set()
    for _ in range(6):
        attempt = world.start("quiz-s")
        q2 = _options(attempt, "q2")
        # where the right answers were shown: q1's "b" and q2's even numbers
        layouts.add((_options(attempt, "q1").index("b"), tuple(q2.index(o) for o in WRITTEN["q2"])))
        fb = world.answer(attempt["id"], "q1", ["b"]).get_json()
        assert fb["correct"] is True and fb["points"] == 2.0
        fb = world.answer(attempt["id"], "q2", ["n6", "n2", "n4"]).get_json()
        assert fb["correct"] is True and fb["points"] == 3.0
        assert world.submit(attempt["id"]).get_json()["score"] == 5.0
    assert len(layouts) > 1  # the answers moved, and were still the right ones


def test_an_item_that_keeps_its_order_is_never_shuffled(world: World) -> None:
    _shuffle_quiz(world, "quiz-s", shuffle=True, fixed=("q2",))
    q1_orders = set()
    for _ in range(6):
        attempt = world.start("quiz-s")
        assert _options(attempt, "q2") == WRITTEN["q2"]
        q1_orders.add(tuple(_options(attempt, "q1")))
    assert len(q1_orders) > 1  # the other items still shuffle
    data = world.get("/api/v1/quizzes/quiz-s/data", "prof").get_json()
    assert [it["shuffle"] for it in data["items"]] == [True, False, True]


def test_a_quiz_that_does_not_shuffle_shows_the_written_order(world: World) -> None:
    _shuffle_quiz(world, "quiz-f", shuffle=False)
    for _ in range(3):
        attempt = world.start("quiz-f")
        assert {i["id"]: _options(attempt, i["id"]) for i in attempt["items"]} == WRITTEN


def _signin(client: FlaskClient, token: str) -> None:
    page = client.get("/signin").get_data(as_text=True)
    form_token = re.search(r'name="signin_token" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    assert (
        client.post("/signin", data={"token": token, "signin_token": form_token}).status_code == 303
    )


def test_instructor_preview_says_how_options_are_ordered(world: World) -> None:
    _shuffle_quiz(world, "quiz-s", shuffle=True, fixed=("q2",))
    _shuffle_quiz(world, "quiz-f", shuffle=False, fixed=("q2",))
    c = world.app.test_client()
    _signin(c, world.tokens["prof"])
    shuffled = " ".join(c.get("/quiz/quiz-s").get_data(as_text=True).split())
    assert "options shuffled per attempt" in shuffled
    assert shuffled.count("options keep this order") == 1
    assert re.search(r"q2 · revision 1 · 3 points · options keep this order", shuffled)
    fixed = " ".join(c.get("/quiz/quiz-f").get_data(as_text=True).split())
    assert "options in the written order" in fixed
    assert "options shuffled" not in fixed and "options keep this order" not in fixed


# ---- Idempotency-Key -------------------------------------------------------------------------


def test_idempotent_attempt_start(world: World, session: Session) -> None:
    h = {"Idempotency-Key": "start-1"}
    r1 = world.post("/api/v1/quizzes/quiz-a/attempts", "alice", json={"lang": "en"}, headers=h)
    r2 = world.post("/api/v1/quizzes/quiz-a/attempts", "alice", json={"lang": "en"}, headers=h)
    assert r1.status_code == r2.status_code == 201
    assert r1.get_json() == r2.get_json()
    assert r2.headers["Idempotent-Replayed"] == "true"
    assert r2.headers["Location"] == r1.headers["Location"]
    assert _count(session, Attempt) == 1
    # Same key, different body: refused, naming the header.
    r3 = world.post("/api/v1/quizzes/quiz-a/attempts", "alice", json={"lang": "source"}, headers=h)
    assert r3.status_code == 422
    assert "Idempotency-Key" in r3.get_json()["errors"]["headers"]
    # Keys are per token: bob's "start-1" is a different request.
    assert (
        world.post(
            "/api/v1/quizzes/quiz-a/attempts", "bob", json={"lang": "en"}, headers=h
        ).status_code
        == 201
    )
    assert _count(session, Attempt) == 2


def test_idempotent_response_and_submit(world: World, session: Session) -> None:
    aid = world.start("quiz-a")["id"]
    h = {"Idempotency-Key": "ans-q1"}
    body = {"item_id": "q1", "answer": ["b"]}
    r1 = world.post(f"/api/v1/attempts/{aid}/responses", "alice", json=body, headers=h)
    r2 = world.post(f"/api/v1/attempts/{aid}/responses", "alice", json=body, headers=h)
    assert r1.status_code == r2.status_code == 201 and r1.get_json() == r2.get_json()
    assert _count(session, ResponseRecord) == 1
    # Without the key, the same answer is a conflict, as always.
    assert world.post(f"/api/v1/attempts/{aid}/responses", "alice", json=body).status_code == 409

    s1 = world.post(f"/api/v1/attempts/{aid}/submit", "alice", headers={"Idempotency-Key": "sub"})
    s2 = world.post(f"/api/v1/attempts/{aid}/submit", "alice", headers={"Idempotency-Key": "sub"})
    assert s1.status_code == s2.status_code == 200 and s1.get_json() == s2.get_json()
    assert world.submit(aid).status_code == 409


def test_idempotency_key_reused_on_another_endpoint_is_422(world: World) -> None:
    aid = world.start("quiz-a")["id"]
    h = {"Idempotency-Key": "k"}
    assert (
        world.post(
            f"/api/v1/attempts/{aid}/responses",
            "alice",
            json={"item_id": "q1", "answer": ["b"]},
            headers=h,
        ).status_code
        == 201
    )
    r = world.post(f"/api/v1/attempts/{aid}/submit", "alice", headers=h)
    assert r.status_code == 422 and "Idempotency-Key" in r.get_json()["errors"]["headers"]


def test_failed_request_does_not_store_its_key(world: World, session: Session) -> None:
    aid = world.start("quiz-a")["id"]
    h = {"Idempotency-Key": "retry-me"}
    r = world.post(
        f"/api/v1/attempts/{aid}/responses",
        "alice",
        json={"item_id": "q1", "answer": ["zz"]},
        headers=h,
    )
    assert r.status_code == 422
    assert _count(session, IdempotencyRecord) == 0
    # The corrected retry with the same key goes through.
    r = world.post(
        f"/api/v1/attempts/{aid}/responses",
        "alice",
        json={"item_id": "q1", "answer": ["b"]},
        headers=h,
    )
    assert r.status_code == 201


def test_bad_idempotency_keys_are_400(world: World) -> None:
    for key in ("x" * 300, "caf\u00e9"):
        r = world.client.post(
            "/api/v1/quizzes/quiz-a/attempts",
            headers={**world.h("alice"), "Idempotency-Key": key},
            json={},
        )
        assert r.status_code == 400, key
        assert "Idempotency-Key" in r.get_json()["errors"]["headers"]


def test_concurrent_retries_with_one_key_create_one_attempt(world: World, session: Session) -> None:
    results: list[tuple[int, str]] = []
    barrier = threading.Barrier(5)

    def start() -> None:
        client = world.app.test_client()
        barrier.wait()
        r = client.post(
            "/api/v1/quizzes/quiz-b/attempts",
            headers={**world.h("alice"), "Idempotency-Key": "same"},
            json={},
        )
        results.append((r.status_code, r.get_json()["id"]))

    threads = [threading.Thread(target=start) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {s for s, _ in results} == {201}
    assert len({i for _, i in results}) == 1
    assert _count(session, Attempt) == 1


def test_concurrent_submits_close_the_attempt_once(world: World, session: Session) -> None:
    aid = world.start("quiz-a")["id"]
    world.answer(aid, "q1", ["b"])
    statuses: list[int] = []
    barrier = threading.Barrier(4)

    def submit() -> None:
        client = world.app.test_client()
        barrier.wait()
        statuses.append(
            client.post(f"/api/v1/attempts/{aid}/submit", headers=world.h("alice")).status_code
        )

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [200, 409, 409, 409]
    session.rollback()
    attempt = session.get(Attempt, aid)
    assert attempt is not None and attempt.status == "submitted" and attempt.score == 2.0


def test_submit_scores_the_stored_answers_against_the_current_key(
    world: World, session: Session
) -> None:
    aid = world.start("quiz-a")["id"]
    assert world.answer(aid, "q1", ["b"]).get_json()["correct"] is True
    world.answer(aid, "q3", ["f"])
    # the key of q1 was wrong: "a" is its answer (revision 2) while the attempt is under way
    data = quiz_data(QUIZ_A)
    data["items"][0]["options"][0]["correct"] = True
    data["items"][0]["options"][1]["correct"] = False
    assert world.put("/api/v1/quizzes/quiz-a", "prof", json=data).status_code == 200
    session.rollback()
    q3_before = session.execute(
        select(ResponseRecord).where(ResponseRecord.item_id == "q3")
    ).scalar_one()
    q3_before_row = (q3_before.points, q3_before.correct, q3_before.item_revision)
    body = world.submit(aid).get_json()
    items = {i["item_id"]: i for i in body["items"]}
    assert items["q1"]["points"] == 0.0 and items["q1"]["revision"] == 2
    assert body["score"] == 1.0
    session.rollback()
    q1 = session.execute(select(ResponseRecord).where(ResponseRecord.item_id == "q1")).scalar_one()
    assert (q1.points, q1.correct, q1.max_points, q1.item_revision) == (0.0, False, 2.0, 2)
    q3 = session.execute(select(ResponseRecord).where(ResponseRecord.item_id == "q3")).scalar_one()
    assert (q3.points, q3.correct, q3.item_revision) == q3_before_row
    attempt = session.get(Attempt, aid)
    assert attempt is not None
    assert attempt.item_revisions == {"q1": 2, "q2": 1, "q3": 1} and attempt.quiz_revision == 2
    assert attempt.submitted_at is not None and attempt.graded_at == attempt.submitted_at
