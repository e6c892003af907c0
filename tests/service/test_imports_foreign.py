"""Importing files no one here wrote: Moodle's own XML import fixtures, QTI 2.1 samples from
oat-sa/qti-sdk and Canvas QTI files from instructure/canvas-lms (sources and licences:
tests/fixtures/foreign/README.md). Expected values are read from the files by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from item_bank.model import Quiz
from service.imports import ImportFailed, import_quiz

FOREIGN = Path(__file__).resolve().parents[1] / "fixtures" / "foreign"


def load(rel: str) -> tuple[Quiz, list[str]]:
    path = FOREIGN / rel
    result = import_quiz(path.read_bytes(), path.name)
    return result.quiz, result.warnings


def options(quiz: Quiz, n: int = 0) -> list[tuple[str, bool]]:
    return [(o.text.en, o.correct) for o in quiz.items[n].options]


def test_moodle_multichoice_fixture() -> None:
    quiz, warnings = load("moodle/multichoice.xml")
    assert quiz.title.en == "Multichoice"
    (item,) = quiz.items
    assert item.id == "Greeting" and item.type == "multiple_choice"
    assert item.prompt.en.endswith("What language is being spoken?")
    # The flags are images beside the words; the words stay, French is right.
    assert options(quiz)[:2] == [("English", False), ("French", True)]
    assert [c for _, c in options(quiz)] == [False, True, False, False]
    # The sound file and images in the answers are named, not dropped silently.
    assert any("Greeting" in w and "not imported" in w for w in warnings)


def test_moodle_truefalse_fixture() -> None:
    quiz, _ = load("moodle/truefalse.xml")
    by_id = {it.id: it for it in quiz.items}
    assert set(by_id) == {"Moodle-acronym-False", "Moodle-acronym-True"}
    for qid, truth in (("Moodle-acronym-True", True), ("Moodle-acronym-False", False)):
        it = by_id[qid]
        assert it.type == "true_false"
        assert [(o.text.en, o.correct) for o in it.options] == [
            ("True", truth),
            ("False", not truth),
        ]
        assert all(o.feedback is not None and o.feedback.en for o in it.options)


def test_moodle_unsupported_types_are_named_per_item() -> None:
    quiz, warnings = load("moodle/nested_categories_with_questions.xml")
    assert [it.type for it in quiz.items] == ["true_false"] * 4
    essay = [w for w in warnings if "Kappa Essay Question" in w]
    assert len(essay) == 1 and "'essay' is not supported" in essay[0]


@pytest.mark.parametrize(
    ("rel", "names"),
    [
        ("moodle/categories_reverse_order.xml", ["'essay'", "'shortanswer'"]),
        ("moodle/multianswer.xml", ["'cloze'"]),
        ("qti21/extended_text.xml", ["extendedTextInteraction"]),
        ("qti21/match.xml", ["matchInteraction"]),
    ],
)
def test_nothing_importable_is_a_clear_error(rel: str, names: list[str]) -> None:
    path = FOREIGN / rel
    with pytest.raises(ImportFailed) as err:
        import_quiz(path.read_bytes(), path.name)
    assert err.value.field == "file"
    assert "no question in the file can be imported" in str(err.value)
    for name in names:
        assert any(name in w and "not supported" in w for w in err.value.warnings), name


def test_moodle_image_tag_fixture_keeps_the_choice_question() -> None:
    quiz, warnings = load("moodle/sample_questions_with_old_image_tag.xml")
    assert [it.id for it in quiz.items] == ["mcq-with-image"]
    assert any("'cloze'" in w for w in warnings)


def test_qti21_choice_sample() -> None:
    quiz, warnings = load("qti21/choice.xml")
    assert quiz.title.en == "Unattended Luggage"
    (item,) = quiz.items
    assert item.prompt.en == "Look at the text in the picture.\n\nWhat does it say?"
    assert options(quiz)[0] == ("You must stay with your luggage at all times.", True)
    assert [c for _, c in options(quiz)] == [True, False, False]
    assert item.shuffle is True and quiz.settings.shuffle_answers is False  # shuffle="false"
    assert any("img" in w for w in warnings)


def test_qti21_multiple_response_sample() -> None:
    quiz, _ = load("qti21/choice_multiple.xml")
    (item,) = quiz.items
    assert item.type == "multiple_answers"
    assert [t for t, c in options(quiz) if c] == ["Hydrogen", "Oxygen"]


def test_qti21_modal_feedback_sample() -> None:
    """Question-level correct/incorrect feedback lands on the right and the wrong answer."""
    quiz, _ = load("qti21/modalFeedback.xml")
    (item,) = quiz.items
    assert item.points == 10
    assert [(o.text.en, o.correct, o.feedback.en) for o in item.options] == [
        ("True", True, "correct"),
        ("False", False, "incorrect"),
    ]


def test_canvas_qti12_bank_item() -> None:
    quiz, warnings = load("canvas/multiple_choice_html.xml")
    (item,) = quiz.items
    assert item.points == 10 and item.prompt.en == "html for fun"
    assert options(quiz) == [("html answer 1", True), ("html answer 2", False)]
    assert item.explanation.en == "meh"
    assert [o.feedback.en for o in item.options if o.feedback] == ["comment", "comment"]
    # correct_fb / general_incorrect_fb have no place in the bank: said, not dropped.
    assert any("general_incorrect_fb" in w for w in warnings)


def test_canvas_converted_true_false_without_correct_response() -> None:
    """Canvas's QTI 2 converter marks the right answer only by the SCORE rule."""
    quiz, _ = load("canvas/true_false_qti2.xml")
    (item,) = quiz.items
    assert item.points == 10
    assert options(quiz) == [("True", False), ("False", True)]
    assert item.options[1].feedback is not None
    assert item.options[1].feedback.en == "You're an idiot."
