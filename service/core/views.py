"""Rendering quizzes, items and responses for the API in one delivery language.

Students see prompts and options only; the key (correct flags, feedback, explanation) of an item
appears only in a response they have made (``feedback_for``) or when the caller is an instructor.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from item_bank.model import Item, Quiz, Text


class StoredAnswer(Protocol):
    """A stored response as ``response_view`` reads it: a ``ResponseRecord``, or the plain
    values an answer just wrote (building an ORM object for them cost more than their view)."""

    attempt_id: str
    item_id: str
    item_revision: int
    answer: list[str]
    correct: bool
    points: float
    max_points: float
    times_answered: int
    answered_at: datetime


def render(text: Text, lang: str, source_lang: str) -> str:
    return text.render(lang, source_lang)[1]


def option_order(item: Item, seed: str | None) -> list[int]:
    """Option positions, shuffled per attempt when the quiz asks for it and the item allows it
    (stable on reload: the seed is the attempt's id)."""
    order = list(range(len(item.options)))
    if seed is not None and item.shuffle:
        random.Random(f"{seed}:{item.id}").shuffle(order)
    return order


def item_view(
    item: Item, quiz: Quiz, lang: str, *, with_key: bool, shuffle_seed: str | None = None
) -> dict[str, Any]:
    src = quiz.source_lang
    options = []
    for i in option_order(item, shuffle_seed):
        o = item.options[i]
        view: dict[str, Any] = {"id": o.id, "text": render(o.text, lang, src)}
        if with_key:
            view["correct"] = o.correct
            view["feedback"] = render(o.feedback, lang, src) if o.feedback else None
        options.append(view)
    out: dict[str, Any] = {
        "id": item.id,
        "type": item.type,
        "points": item.points,
        "revision": item.revision,
        "topics": list(item.topics),
        "prompt": render(item.prompt, lang, src),
        "options": options,
    }
    if with_key:
        out["correct_options"] = list(item.correct_ids)
        out["explanation"] = render(item.explanation, lang, src)
    return out


def settings_view(quiz: Quiz) -> dict[str, Any]:
    s = quiz.settings
    return {
        "allowed_attempts": s.allowed_attempts,
        "allow_reanswer": s.allow_reanswer,
        "shuffle_answers": s.shuffle_answers,
        "time_limit_minutes": s.time_limit_minutes,
        "scoring_policy": s.scoring_policy,
    }


def quiz_summary(quiz: Quiz, lang: str) -> dict[str, Any]:
    return {
        "id": quiz.id,
        "title": render(quiz.title, lang, quiz.source_lang),
        "description": render(quiz.description, lang, quiz.source_lang),
        "source_lang": quiz.source_lang,
        "revision": quiz.revision,
        "item_count": len(quiz.items),
        "points_possible": quiz.points_possible,
        "settings": settings_view(quiz),
    }


def quiz_view(quiz: Quiz, lang: str, *, with_key: bool) -> dict[str, Any]:
    return {
        **quiz_summary(quiz, lang),
        "lang": lang,
        "items": [item_view(it, quiz, lang, with_key=with_key) for it in quiz.items],
    }


def feedback_for(item: Item, quiz: Quiz, lang: str, answer: Sequence[str]) -> dict[str, Any]:
    """The key revealed once an item is answered: correct ids, explanation, chosen feedback."""
    src = quiz.source_lang
    chosen = set(answer)
    return {
        "correct_options": list(item.correct_ids),
        "explanation": render(item.explanation, lang, src),
        "option_feedback": [
            {
                "option_id": o.id,
                "correct": o.correct,
                "feedback": render(o.feedback, lang, src) if o.feedback else None,
            }
            for o in item.options
            if o.id in chosen
        ],
    }


def response_view(
    rec: StoredAnswer, item: Item | None, quiz: Quiz, lang: str, *, reanswer: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "attempt_id": rec.attempt_id,
        "item_id": rec.item_id,
        "item_revision": rec.item_revision,
        "answer": list(rec.answer),
        "correct": rec.correct,
        "points": rec.points,
        "max_points": rec.max_points,
        "times_answered": rec.times_answered,
        "answered_at": rec.answered_at,
        "can_reanswer": reanswer,
    }
    if item is not None:
        out.update(feedback_for(item, quiz, lang, rec.answer))
    return out
