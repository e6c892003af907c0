"""Quizzes in the database: bank import and sync, revision history; the bank quizzes end to end."""

from __future__ import annotations

from dataclasses import replace

from flask import Flask
from sqlalchemy.orm import Session

from item_bank import all_quizzes
from service import quizzes_store as store
from service.db import write_intent
from tests.service.conftest import World


def _sync(app: Flask, quizzes: list | None = None) -> store.BankSync:
    from service.extensions import db

    with app.app_context(), write_intent():
        result = store.sync_bank(db.session, quizzes)
        db.session.commit()
    return result


def test_bank_import_is_idempotent_and_follows_bank_edits(app: Flask, session: Session) -> None:
    bank = all_quizzes()
    first = _sync(app, bank)
    assert first.created == [q.id for q in bank]
    assert _sync(app, bank).created == [] and _sync(app, bank).updated == []
    # The bank file changes one item's explanation: the stored quiz follows, bumping that item.
    quiz = bank[0]
    item = quiz.items[0]
    edited = replace(
        quiz,
        items=(replace(item, explanation=replace(item.explanation, text="New.")),) + quiz.items[1:],
    )
    result = _sync(app, [edited])
    assert result.updated == [quiz.id]
    stored = store.get_quiz(session, quiz.id)
    assert stored.items[0].revision == item.revision + 1 and stored.revision == quiz.revision + 1
    assert stored.items[1].revision == quiz.items[1].revision
    assert store.item_history(session, quiz.id)[item.id] == [item.revision, item.revision + 1]


def test_instructor_edits_are_kept_over_the_bank(world: World) -> None:
    bank = all_quizzes()
    _sync(world.app, bank)
    quiz_id = bank[0].id
    data = world.get(f"/api/v1/quizzes/{quiz_id}/data", "prof").get_json()
    data["settings"]["allowed_attempts"] = 9
    assert world.put(f"/api/v1/quizzes/{quiz_id}", "prof", json=data).status_code == 200
    result = _sync(world.app, bank)
    assert quiz_id in result.kept and quiz_id not in result.updated
    got = world.get(f"/api/v1/quizzes/{quiz_id}", "alice").get_json()
    assert got["settings"]["allowed_attempts"] == 9


def test_both_bank_quizzes_end_to_end(world: World) -> None:
    """A student takes each shipped quiz in its source language, with feedback at every step."""
    bank = all_quizzes()
    assert len(bank) >= 2
    _sync(world.app, bank)
    for quiz in bank:
        attempt = world.start(quiz.id, who="bob", lang="source")
        assert (
            attempt["items"][0]["prompt"]
            == quiz.items[0].prompt.render("source", quiz.source_lang)[1]
        )
        for item in quiz.items:
            r = world.answer(attempt["id"], item.id, list(item.correct_ids), who="bob")
            assert r.status_code == 201
            fb = r.get_json()
            assert fb["correct"] and fb["points"] == item.points
            assert fb["explanation"] == item.explanation.render("source", quiz.source_lang)[1]
        result = world.submit(attempt["id"], who="bob").get_json()
        assert result["score"] == result["max_score"] == quiz.points_possible
        grades = world.get(f"/api/v1/quizzes/{quiz.id}/grades", "prof").get_json()
        assert grades["students"][0]["best_score"] == quiz.points_possible
