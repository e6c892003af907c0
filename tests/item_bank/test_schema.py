"""The quiz schema rejects bad data with messages naming the file, item and field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from item_bank import BankError, dump_quiz, load_quiz


def quiz_data() -> dict[str, Any]:
    fb = {"lang": "en", "text": "Not this one.", "sn": "Kwete iyi."}
    return {
        "id": "demo",
        "title": {"lang": "sn", "text": "Bvunzo", "en": "Quiz"},
        "description": {"lang": "en", "text": "Practice."},
        "source_lang": "sn",
        "items": [
            {
                "id": "q1",
                "topics": ["ring-attention"],
                "prompt": {"lang": "sn", "text": "Chii?", "en": "What?"},
                "options": [
                    {"id": "a", "text": {"lang": "en", "text": "K/V"}, "correct": True},
                    {
                        "id": "b",
                        "text": {"lang": "en", "text": "Q"},
                        "correct": False,
                        "feedback": fb,
                    },
                ],
                "explanation": {"lang": "en", "text": "Because.", "sn": "Nokuti."},
            }
        ],
    }


def messages(data: dict[str, Any]) -> list[str]:
    with pytest.raises(BankError) as exc:
        load_quiz(data, source="demo.yaml")
    return exc.value.messages


def test_valid_quiz_round_trips() -> None:
    quiz = load_quiz(quiz_data(), source="demo.yaml")
    assert quiz.items[0].correct_ids == ("a",)
    assert quiz.items[0].prompt.seed and not quiz.items[0].explanation.seed
    assert load_quiz(dump_quiz(quiz)) == quiz


def test_no_correct_option() -> None:
    data = quiz_data()
    data["items"][0]["options"][0]["correct"] = False
    data["items"][0]["options"][0]["feedback"] = {"lang": "en", "text": "x", "sn": "y"}
    assert messages(data) == ["demo.yaml: item q1: options: no option is marked correct"]


def test_duplicate_item_and_option_ids() -> None:
    data = quiz_data()
    data["items"].append(copy.deepcopy(data["items"][0]))
    data["items"][0]["options"][1]["id"] = "a"
    msgs = messages(data)
    assert "demo.yaml: item q1: id: duplicate item id 'q1'" in msgs
    assert "demo.yaml: item q1: options.1.id: duplicate option id 'a'" in msgs


def test_missing_english_translation() -> None:
    data = quiz_data()
    del data["items"][0]["prompt"]["en"]
    assert messages(data) == [
        "demo.yaml: item q1: prompt.en: missing translation: add an 'en' version"
    ]


def test_missing_source_language_translation_of_explanation() -> None:
    data = quiz_data()
    del data["items"][0]["explanation"]["sn"]
    assert messages(data) == [
        "demo.yaml: item q1: explanation.sn: missing translation: add a 'sn' version"
    ]


@pytest.mark.parametrize("where", ["lang", "translation"])
def test_unknown_language_tag(where: str) -> None:
    data = quiz_data()
    if where == "lang":
        data["items"][0]["prompt"]["lang"] = "xx"
        expect = "demo.yaml: item q1: prompt.lang: Must be one of: el, en, sn."
    else:
        data["items"][0]["prompt"]["fr"] = "Quoi ?"
        expect = "demo.yaml: item q1: prompt.fr: unknown language tag 'fr'; use one of el, en, sn"
    assert expect in messages(data)


def test_wrong_option_needs_feedback() -> None:
    data = quiz_data()
    del data["items"][0]["options"][1]["feedback"]
    assert messages(data) == [
        "demo.yaml: item q1: options.1.feedback: a wrong option needs feedback saying what is wrong"
    ]


def test_several_correct_options_need_multiple_answers_type() -> None:
    data = quiz_data()
    data["items"][0]["options"][1]["correct"] = True
    assert messages(data) == [
        "demo.yaml: item q1: type: 2 correct options need type 'multiple_answers', not 'multiple_choice'"
    ]
    data["items"][0]["type"] = "multiple_answers"
    assert load_quiz(data).items[0].correct_ids == ("a", "b")


def test_bare_string_and_unknown_fields_are_named() -> None:
    data = quiz_data()
    data["items"][0]["options"][0]["text"] = "K/V"
    data["items"][0]["colour"] = "red"
    msgs = messages(data)
    assert "demo.yaml: item q1: colour: Unknown field." in msgs
    data = quiz_data()
    data["items"][0]["options"][0]["text"] = "K/V"
    assert messages(data) == [
        "demo.yaml: item q1: options.0.text: a text needs its language: write {lang: en, text: ...}"
        " instead of a bare string"
    ]


def test_not_a_mapping() -> None:
    with pytest.raises(BankError, match="must be a mapping"):
        load_quiz(["q1"], source="list.yaml")


def test_render_modes() -> None:
    quiz = load_quiz(quiz_data())
    item = quiz.items[0]
    assert item.prompt.render("en", quiz.source_lang) == ("en", "What?")
    assert item.prompt.render("source", quiz.source_lang) == ("sn", "Chii?")
    assert item.explanation.render("source", quiz.source_lang) == ("sn", "Nokuti.")
    assert item.options[0].text.render("source", quiz.source_lang) == ("en", "K/V")
    assert list(item.prompt.variants(quiz.source_lang)) == ["sn", "en"]
    with pytest.raises(ValueError, match="variants"):
        item.prompt.render("all", "sn")
