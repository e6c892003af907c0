"""The grading core: answer validation, single and partial credit, attempts, regrade diffs."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from item_bank import load_quiz
from service import grading
from tests.service.conftest import QUIZ_A

QUIZ = load_quiz(copy.deepcopy(QUIZ_A))
MC, MA, TF = QUIZ.items  # q1 (2 pts), q2 (3 pts: n2 n4 n6 correct), q3 (1 pt)


def test_single_answer_full_or_nothing() -> None:
    assert grading.score_item(MC, ["b"]).points == 2.0
    assert grading.score_item(MC, ["b"]).correct
    assert grading.score_item(MC, ["a"]).points == 0.0
    assert grading.score_item(TF, ["f"]).points == 1.0
    assert not grading.score_item(TF, ["t"]).correct


@pytest.mark.parametrize(
    ("answer", "points", "correct"),
    [
        (["n2", "n4", "n6"], 3.0, True),
        (["n2"], 1.0, False),
        (["n2", "n4"], 2.0, False),
        (["n2", "n3"], 0.0, False),  # right - wrong = 0
        (["n2", "n4", "n3"], 1.0, False),  # 2 - 1 = 1 of 3
        (["n3", "n5"], 0.0, False),  # floored at 0, never negative
        (["n2", "n3", "n4", "n5", "n6"], 1.0, False),  # all options: 3 - 2 = 1
    ],
)
def test_multiple_answers_partial_credit(answer: list[str], points: float, correct: bool) -> None:
    s = grading.score_item(MA, answer)
    assert s.points == pytest.approx(points)
    assert s.correct is correct
    assert s.max_points == 3.0


def test_partial_credit_fractions_are_rounded() -> None:
    item = replace(MA, points=1.0)
    assert grading.score_item(item, ["n2"]).points == 0.333333


@pytest.mark.parametrize(
    ("item", "answer", "fragment"),
    [
        (MC, [], "at least one"),
        (MC, ["z"], "unknown option"),
        (MC, ["a", "b"], "exactly one"),
        (TF, ["t", "f"], "exactly one"),
        (MA, ["n2", "n2"], "more than once"),
    ],
)
def test_bad_answers_are_refused(item: object, answer: list[str], fragment: str) -> None:
    with pytest.raises(grading.AnswerError, match=fragment):
        grading.score_item(item, answer)  # type: ignore[arg-type]


def test_answer_is_normalized_to_option_order() -> None:
    assert grading.score_item(MA, ["n6", "n2"]).answer == ("n2", "n6")


def test_score_attempt_unanswered_items_score_zero() -> None:
    result = grading.score_attempt(QUIZ, {"q1": ["b"], "q2": ["n2", "n4"]})
    assert result.score == 4.0
    assert result.max_score == 6.0
    by_id = {s.item_id: s for s in result.items}
    assert not by_id["q3"].answered and by_id["q3"].points == 0.0
    assert result.revisions == {"q1": 1, "q2": 1, "q3": 1}


def test_score_attempt_ignores_answers_to_removed_items() -> None:
    result = grading.score_attempt(QUIZ, {"gone": ["x"], "q3": ["f"]})
    assert result.score == 1.0


def test_stored_answer_with_a_removed_option_counts_as_wrong() -> None:
    # The key changed after answering: option n3 no longer exists.
    item = replace(MA, options=tuple(o for o in MA.options if o.id != "n3"))
    quiz = replace(QUIZ, items=(MC, item, TF))
    result = grading.score_attempt(quiz, {"q2": ["n2", "n4", "n3"], "q1": ["gone"]})
    by_id = {s.item_id: s for s in result.items}
    assert by_id["q2"].points == 1.0  # 2 right - 1 (removed, wrong) = 1 of 3
    assert by_id["q1"].points == 0.0


def test_diff_item_points_reports_changes_only() -> None:
    new = grading.score_attempt(QUIZ, {"q1": ["b"], "q2": ["n2"]}).items
    changes = grading.diff_item_points({"q1": (0.0, 1), "q2": (1.0, 1), "q3": (0.0, 1)}, new)
    assert [(c.item_id, c.old_points, c.new_points) for c in changes] == [("q1", 0.0, 2.0)]


def test_diff_item_points_new_item_with_points() -> None:
    new = grading.score_attempt(QUIZ, {"q1": ["b"]}).items
    changes = grading.diff_item_points({}, new)
    assert [(c.item_id, c.old_points, c.old_revision) for c in changes] == [("q1", None, None)]
