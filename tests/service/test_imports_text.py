"""Reading multilingual HTML as Moodle's filters show it, and the language rules of a build."""

from __future__ import annotations

from service.imports import import_quiz
from service.imports._text import read_html


def test_multilang_spans_with_shared_text() -> None:
    html = (
        '<p>Q1. <span lang="el" class="multilang">Γεια</span>'
        '<span lang="EN_us" class="multilang">Hello</span> world</p>'
    )
    assert read_html(html).pieces == [("el", "Q1. Γεια world"), ("en", "Q1. Hello world")]


def test_mlang_blocks_lists_and_other() -> None:
    html = "<p>{mlang sn,el}Mhoro{mlang}{mlang other}Hi{mlang}!</p>"
    assert read_html(html).pieces == [("sn", "Mhoro!"), ("el", "Mhoro!"), ("other", "Hi!")]


def test_plain_html_keeps_paragraphs_and_reports_markup() -> None:
    reading = read_html("<p>One <b>bold</b>\n  line</p><p>Two &amp; three</p>")
    assert reading.pieces == [(None, "One bold line\n\nTwo & three")]
    assert reading.reduced == {"b"}


def _moodle(question_text: str) -> bytes:
    return f"""<?xml version="1.0"?>
<quiz>
  <question type="multichoice">
    <name><text>q1</text></name>
    <questiontext format="html"><text><![CDATA[{question_text}]]></text></questiontext>
    <generalfeedback format="html"><text>Because.</text></generalfeedback>
    <single>true</single>
    <answer fraction="100" format="html"><text>Yes</text><feedback><text>Right.</text></feedback></answer>
    <answer fraction="0" format="html"><text>No</text><feedback><text>Wrong.</text></feedback></answer>
  </question>
</quiz>""".encode()


def test_foreign_multilang_question_with_an_unknown_language() -> None:
    text = (
        '<span lang="fr" class="multilang">Bonjour ?</span>'
        '<span lang="el" class="multilang">Γεια;</span>'
        '<span lang="en" class="multilang">Hello?</span>'
    )
    result = import_quiz(_moodle(text), "greek.xml")
    prompt = result.quiz.items[0].prompt
    # French has no place in the bank: named in a warning; Greek is the source, as first.
    assert (prompt.lang, prompt.text, prompt.translations) == ("el", "Γεια;", {"en": "Hello?"})
    assert result.quiz.source_lang == "el"
    assert any("'fr'" in w for w in result.warnings)
    # Untagged feedback in a Greek quiz is read as Greek and needs an English stand-in.
    assert any("no English version" in w for w in result.warnings)
