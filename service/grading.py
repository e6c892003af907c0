"""The grading core: validating an answer, scoring it, scoring an attempt, diffing regrades.

Pure functions over the item bank's dataclasses (no Flask, no database) so the API, the CLI and
tests share one definition of a score.

Scoring rules:

* ``multiple_choice`` / ``true_false``: exactly one option; full points when it is the correct
  one, else 0.
* ``multiple_answers``: ``points * max(0, (right - wrong) / n_correct)`` where ``right`` and
  ``wrong`` count the chosen correct and chosen incorrect options: partial credit, and guessing
  every option earns nothing.
* An unanswered item scores 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from item_bank.model import Item, Quiz

# Scores are stored as floats; rounding keeps e.g. 2/3 of 1.5 points stable across backends
# (PostgreSQL's float8 and SQLite's REAL round-trip the same value) and in CSV output.
_DIGITS = 6


class AnswerError(ValueError):
    """An answer that cannot be scored (unknown option, wrong count); the API makes it a 422."""


def normalize_answer(item: Item, answer: Sequence[str]) -> tuple[str, ...]:
    """Check ``answer`` against ``item`` and return the chosen option ids in option order."""
    if not answer:
        raise AnswerError("choose at least one option")
    known = [o.id for o in item.options]
    unknown = [a for a in answer if a not in known]
    if unknown:
        raise AnswerError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for item {item.id!r}; "
            f"options are {', '.join(known)}"
        )
    if len(set(answer)) != len(answer):
        raise AnswerError("an option is chosen more than once")
    if item.type != "multiple_answers" and len(answer) != 1:
        raise AnswerError(f"item {item.id!r} ({item.type}) takes exactly one option")
    chosen = set(answer)
    return tuple(o for o in known if o in chosen)


def score_answer(item: Item, answer: Sequence[str]) -> float:
    """Points for an already-normalized answer (see the module docstring)."""
    correct = set(item.correct_ids)
    chosen = set(answer)
    if item.type == "multiple_answers":
        right = len(chosen & correct)
        wrong = len(chosen - correct)
        fraction = max(0.0, (right - wrong) / len(correct))
    else:
        fraction = 1.0 if chosen == correct else 0.0
    return round(item.points * fraction, _DIGITS)


@dataclass(frozen=True)
class ItemScore:
    item_id: str
    revision: int
    answered: bool
    answer: tuple[str, ...]
    correct: bool
    points: float
    max_points: float


def score_item(item: Item, answer: Sequence[str] | None) -> ItemScore:
    """Score one item; ``answer`` None means unanswered. Raises ``AnswerError`` for bad answers."""
    if answer is None:
        return ItemScore(item.id, item.revision, False, (), False, 0.0, item.points)
    chosen = normalize_answer(item, answer)
    points = score_answer(item, chosen)
    return ItemScore(
        item_id=item.id,
        revision=item.revision,
        answered=True,
        answer=chosen,
        correct=set(chosen) == set(item.correct_ids),
        points=points,
        max_points=item.points,
    )


def score_item_lenient(item: Item, answer: Sequence[str] | None) -> ItemScore:
    """Like ``score_item`` but for stored answers graded against a newer key.

    Options chosen then may since have been removed from the item; they count as wrong choices
    instead of making the whole attempt ungradable.
    """
    if answer is None:
        return score_item(item, None)
    try:
        return score_item(item, answer)
    except AnswerError:
        known = {o.id for o in item.options}
        kept = [a for a in dict.fromkeys(answer) if a in known]
        removed = len(set(answer)) - len(kept)
        correct = set(item.correct_ids)
        if item.type == "multiple_answers":
            right = len(set(kept) & correct)
            wrong = len(set(kept) - correct) + removed
            points = round(item.points * max(0.0, (right - wrong) / len(correct)), _DIGITS)
        else:
            points = 0.0
        return ItemScore(item.id, item.revision, True, tuple(answer), False, points, item.points)


@dataclass(frozen=True)
class AttemptScore:
    score: float
    max_score: float
    items: tuple[ItemScore, ...] = field(default_factory=tuple)

    @property
    def revisions(self) -> dict[str, int]:
        return {s.item_id: s.revision for s in self.items}


def score_attempt(quiz: Quiz, answers: Mapping[str, Sequence[str]]) -> AttemptScore:
    """Score every item of ``quiz`` (its current key) given ``{item_id: answer}``.

    Answers to items no longer in the quiz are ignored: the attempt is graded against the quiz
    as it is now, which is what a regrade means.
    """
    items = tuple(score_item_lenient(it, answers.get(it.id)) for it in quiz.items)
    return AttemptScore(
        score=round(sum(s.points for s in items), _DIGITS),
        max_score=round(sum(s.max_points for s in items), _DIGITS),
        items=items,
    )


@dataclass(frozen=True)
class ItemChange:
    item_id: str
    old_points: float | None
    new_points: float
    old_revision: int | None
    new_revision: int


def diff_item_points(
    old: Mapping[str, tuple[float, int]], new: Iterable[ItemScore]
) -> list[ItemChange]:
    """Items whose points changed between a stored grading and a new one.

    ``old`` maps item id to (points, revision) as stored; an item absent there was added to the
    quiz since and counts as changed only when the new grading gives it points.
    """
    changes: list[ItemChange] = []
    for s in new:
        before = old.get(s.item_id)
        if before is None:
            if s.points:
                changes.append(ItemChange(s.item_id, None, s.points, None, s.revision))
            continue
        if abs(before[0] - s.points) > 10**-_DIGITS:
            changes.append(ItemChange(s.item_id, before[0], s.points, before[1], s.revision))
    return changes


__all__ = [
    "AnswerError",
    "AttemptScore",
    "ItemChange",
    "ItemScore",
    "diff_item_points",
    "normalize_answer",
    "score_answer",
    "score_attempt",
    "score_item",
    "score_item_lenient",
]
