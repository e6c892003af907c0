"""Round trip: every export of both bank quizzes, imported again, gives back the same quiz.

"The same quiz" is what the file can carry, compared field by field (``carried`` below):

* Every format carries each question's id, type, points, prompt, options (text, correct,
  feedback, in order) and general feedback (explanation). Option ids are not carried (Moodle
  has none, Canvas uses integers): options are compared in order, ids aside. Topics and
  revisions are in no LMS format; the importer says so in a warning.
* Texts, by language mode: ``en`` → each string's English; ``source`` → each string's source
  form, its language and text (``Text.source_form``); ``all`` → the whole ``Text``: its own
  language, every translation, and whether it is a seed string.
* Per format: the quiz id (all four); the title (Moodle XML under ``all`` keeps only English in
  the category name); the description (Moodle XML, Canvas; CC and QTI 2.1 have none); settings
  (Canvas: all five; CC: time limit and attempts up to 5); each question's effective shuffle
  (quiz flag and item flag; Moodle XML, Canvas, CC, QTI 2.1); the source language (``source``
  and ``all``, where the file shows it).
* QTI 2.1 under ``all``: a seed string written in English comes back with English only (each
  language's test shows a seed string in its own language; see ``_text_view``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from item_bank import get_quiz, load_quiz
from item_bank.model import Quiz, Text
from service.exports import FORMATS, LANG_MODES, MOODLE_FORMATS, export_quiz
from service.imports import import_quiz

QUIZZES = ("ring-attention-quiz", "sparse-attention-quiz")
#: Every export format the importer reads back: all but Moodle backups (.mbz), which only
#: Moodle's restore reads (issue 17 §4).
IMPORTABLE = [fmt for fmt in FORMATS if fmt != "moodle-mbz"]
CASES = [
    (qid, fmt, lang, mlang)
    for qid in QUIZZES
    for fmt in IMPORTABLE
    for lang in LANG_MODES
    for mlang in (("spans", "mlang") if fmt in MOODLE_FORMATS and lang == "all" else ("spans",))
]


def _text_view(t: Text, mode: str, src: str, fmt: str) -> Any:
    if mode == "en":
        return t.en
    if mode == "source":
        return t.source_form(src)
    if fmt == "qti21" and t.seed:
        # QTI 2.1 writes a seed string in its own language in every test that is not English,
        # so an English seed string's translations are not in the package.
        return (t.lang, {k: v for k, v in t.variants(src).items() if k in (t.lang, "en")})
    return t  # all: the whole Text, language, translations and seed flag


def carried(q: Quiz, fmt: str, mode: str, src: str) -> dict[str, Any]:
    """What ``fmt`` in language mode ``mode`` carries of ``q`` (see the module docstring)."""

    def text_view(t: Text, mode: str, src: str) -> Any:
        return _text_view(t, mode, src, fmt)

    out: dict[str, Any] = {"id": q.id}
    if fmt == "moodle-xml" and mode == "all":
        out["title"] = q.title.en
    else:
        out["title"] = text_view(q.title, mode, src)
    if fmt in ("moodle-xml", "qti12"):
        out["description"] = text_view(q.description, mode, src)
    if mode != "en":
        out["source_lang"] = q.source_lang
    s = q.settings
    if fmt == "qti12":
        out["settings"] = (
            s.allowed_attempts,
            s.allow_reanswer,
            s.time_limit_minutes,
            s.scoring_policy,
        )
    if fmt == "imscc":
        attempts = (
            s.allowed_attempts if s.allowed_attempts is None or s.allowed_attempts <= 5 else None
        )
        out["settings"] = (attempts, s.time_limit_minutes)
    out["items"] = [
        {
            "id": it.id,
            "type": it.type,
            "points": it.points,
            "shuffle": s.shuffle_answers and it.shuffle,
            "prompt": text_view(it.prompt, mode, src),
            "explanation": text_view(it.explanation, mode, src),
            "options": [
                (
                    text_view(o.text, mode, src),
                    o.correct,
                    text_view(o.feedback, mode, src) if o.feedback else None,
                )
                for o in it.options
            ],
        }
        for it in q.items
    ]
    return out


@pytest.mark.parametrize(("quiz_id", "fmt", "lang", "mlang"), CASES)
def test_import_of_an_export_is_the_same_quiz(
    quiz_id: str, fmt: str, lang: str, mlang: str
) -> None:
    quiz = get_quiz(quiz_id)
    exported = export_quiz(quiz, fmt, lang, mlang=mlang)
    result = import_quiz(exported.data, exported.filename)
    assert result.format == fmt
    src = quiz.source_lang
    assert carried(result.quiz, fmt, lang, src) == carried(quiz, fmt, lang, src)
    # What the format could not carry is named, never silently dropped.
    assert any("topics" in w for w in result.warnings)


@pytest.mark.parametrize("fmt", IMPORTABLE)
def test_round_trip_keeps_a_question_that_keeps_its_order(fmt: str) -> None:
    """One item with ``shuffle: false`` among shuffled ones comes back as such."""
    from dataclasses import replace

    quiz = get_quiz(QUIZZES[0])
    items = list(quiz.items)
    items[1] = replace(items[1], shuffle=False)
    quiz = replace(quiz, items=tuple(items))
    exported = export_quiz(quiz, fmt, "all")
    back = import_quiz(exported.data, exported.filename).quiz
    effective = [back.settings.shuffle_answers and it.shuffle for it in back.items]
    assert effective == [it.shuffle for it in quiz.items]


@pytest.mark.parametrize("fmt", IMPORTABLE)
@pytest.mark.parametrize("lang", LANG_MODES)
def test_round_trip_of_all_item_types(fmt: str, lang: str) -> None:
    """The API tests' quiz A: Greek source, 2 points, multiple answers, true/false, English
    seed strings with Greek translations."""
    from tests.service.conftest import QUIZ_A

    quiz = load_quiz(copy.deepcopy(QUIZ_A))
    assert {it.type for it in quiz.items} == {"multiple_choice", "multiple_answers", "true_false"}
    exported = export_quiz(quiz, fmt, lang)
    back = import_quiz(exported.data, exported.filename).quiz
    src = quiz.source_lang
    assert carried(back, fmt, lang, src) == carried(quiz, fmt, lang, src)


def test_a_second_import_is_stable() -> None:
    """import(export(import(export(q)))) == import(export(q)): nothing drifts on a re-run."""
    quiz = get_quiz(QUIZZES[1])
    once = import_quiz(export_quiz(quiz, "moodle-xml", "all").data, "a.xml").quiz
    twice = import_quiz(export_quiz(once, "moodle-xml", "all").data, "b.xml").quiz
    assert twice == once


def test_a_moodle_backup_is_refused_with_the_way_forward() -> None:
    from service.imports import ImportFailed

    data = export_quiz(get_quiz(QUIZZES[0]), "moodle-mbz", "all").data
    with pytest.raises(ImportFailed, match=r"Moodle backup \(\.mbz\).*Moodle XML"):
        import_quiz(data, "quiz.mbz")
