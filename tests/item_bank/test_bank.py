"""The shipped item bank: both course quizzes load, keep the seeds verbatim, and are complete."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from item_bank import LANGUAGES, all_quizzes, check_bank, get_quiz
from item_bank.bank import QUIZ_DIR, UnknownQuiz
from item_bank.bank import check_bank as check_dir
from service.cli import main
from tests.conftest import SHARED

SEEDS = {
    "ring-attention-quiz": "000_37260a45fa6398ce.txt",
    "sparse-attention-quiz": "001_c117c6489666c296.txt",
}


def parse_seed(path: Path) -> tuple[str, str, list[tuple[str, list[str]]]]:
    """(title, subtitle, [(prompt, [options])]) exactly as the course wrote them."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    title, subtitle, rest = lines[0], lines[1], lines[2:]
    items: list[tuple[str, list[str]]] = []
    for ln in rest:
        m = re.match(r"^(\d+)\. (.*)$", ln)
        if m:
            assert int(m.group(1)) == len(items) + 1
            items.append((m.group(2), []))
        else:
            m = re.match(r"^\s+• (.*)$", ln)
            assert m, f"unexpected seed line {ln!r}"
            items[-1][1].append(m.group(1))
    return title, subtitle, items


def test_bank_is_valid() -> None:
    report = check_bank()
    assert report.errors == ()
    assert sorted(q.id for q in report.quizzes) == sorted(SEEDS)


@pytest.mark.parametrize("quiz_id", sorted(SEEDS))
def test_seed_text_is_verbatim_and_in_order(quiz_id: str) -> None:
    seed = SHARED / "seeds" / SEEDS[quiz_id]
    if not seed.exists():
        pytest.fail(f"seed file missing: {seed}")
    title, subtitle, items = parse_seed(seed)
    quiz = get_quiz(quiz_id)
    assert quiz.source_file == SEEDS[quiz_id]
    assert quiz.title.text == title
    assert quiz.description.text == subtitle
    assert [it.id for it in quiz.items] == [f"q{i + 1}" for i in range(len(items))]
    for it, (prompt, options) in zip(quiz.items, items, strict=True):
        assert it.prompt.text == prompt
        assert [o.text.text for o in it.options] == options
        assert [o.id for o in it.options] == list("abcdefghijklmnopqrstuvwxyz"[: len(options)])


@pytest.mark.parametrize("quiz_id", sorted(SEEDS))
def test_every_string_tagged_translated_and_taught(quiz_id: str) -> None:
    quiz = get_quiz(quiz_id)
    langs = {t.lang for t in quiz.texts() if t.seed}
    assert langs <= set(LANGUAGES)
    assert quiz.source_lang in langs and "en" in langs  # the seeds really are mixed
    for t in quiz.texts():
        assert t.en.strip(), t
        if not t.seed:  # authored: English plus the quiz's source language
            assert t.lang == "en" and t.get(quiz.source_lang), t
    for it in quiz.items:
        assert it.correct_ids, it.id
        assert len(it.explanation.en) > 60, f"{it.id}: explanation too thin to teach"
        for o in it.options:
            if not o.correct:
                assert o.feedback is not None and len(o.feedback.en) > 20, (it.id, o.id)
        assert it.topics and it.revision >= 1 and it.points > 0


def test_non_english_text_is_really_that_language() -> None:
    # Three Greek letters in a row make a word; a lone Σ or π in a formula does not.
    greek = re.compile(r"[\u0370-\u03ff\u1f00-\u1fff]{3,}")
    for quiz in all_quizzes():
        for t in quiz.texts():
            for lang, value in t.variants(quiz.source_lang).items():
                if lang == "el":
                    assert greek.search(value), value
                else:
                    assert not greek.search(value), (lang, value)


def test_bad_file_is_reported_with_its_name(tmp_path: Path) -> None:
    good = (QUIZ_DIR / "ring-attention-quiz.yaml").read_text(encoding="utf-8")
    (tmp_path / "ring-attention-quiz.yaml").write_text(good, encoding="utf-8")
    (tmp_path / "broken.yaml").write_text("id: [unclosed", encoding="utf-8")
    (tmp_path / "other.yaml").write_text(good, encoding="utf-8")
    report = check_dir(tmp_path)
    assert [q.id for q in report.quizzes] == ["ring-attention-quiz"]
    assert report.errors[0].startswith("broken.yaml: cannot read:")
    assert (
        report.errors[1] == "other.yaml: id: quiz id 'ring-attention-quiz' must match the file name"
    )


def test_unknown_quiz_lists_known() -> None:
    with pytest.raises(
        UnknownQuiz, match="known quizzes: ring-attention-quiz, sparse-attention-quiz"
    ):
        get_quiz("nope")


def test_cli_validate_list_show() -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["items", "validate"])
    assert res.exit_code == 0, res.output
    assert "ok  ring-attention-quiz: 8 items" in res.output
    res = runner.invoke(main, ["items", "list", "--json"])
    assert [r["id"] for r in json.loads(res.output)] == sorted(SEEDS)
    res = runner.invoke(main, ["items", "show", "sparse-attention-quiz", "--json"])
    assert res.exit_code == 0
    shown = json.loads(res.output)
    q1 = shown["items"][0]
    assert q1["correct"] == [o["id"] for o in q1["options"] if o["correct"]]
    assert set(q1["prompt"]["texts"]) == {"el", "en"}
    assert q1["explanation"]["texts"]["el"]
    res = runner.invoke(main, ["items", "show", "nope"])
    assert res.exit_code == 1 and "unknown quiz 'nope'" in res.output


def test_cli_validate_fails_on_bad_bank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "x.yaml").write_text("id: x\n", encoding="utf-8")
    monkeypatch.setattr(sys.modules["service.cli.items"], "check_bank", lambda: check_dir(tmp_path))
    res = CliRunner().invoke(main, ["items", "validate"])
    assert res.exit_code == 1
    assert "error  x.yaml: title: Missing data for required field." in res.output
