"""Moodle XML question bank (exports.md §4): Question bank → Import in Moodle.

Shuffling is per question (``<shuffleanswers>``), from ``_common.shuffles``; Moodle's truefalse
type has no such flag and always shows True before False.
"""

from __future__ import annotations

from lxml import etree

from item_bank.model import Item, Quiz
from service.exports._common import (
    HtmlStyle,
    format_points,
    html_block,
    html_inline,
    pieces,
    plain,
    shuffles,
    sub,
    true_false_value,
    xml_bytes,
)

#: The grades Moodle accepts for an answer, in percent (question/engine/bank.php); anything else
#: makes the import reject the question. Negatives of these are allowed too.
ALLOWED_FRACTIONS: tuple[str, ...] = (
    "100", "90", "83.33333", "80", "75", "70", "66.66667", "60", "50", "40", "33.33333",
    "30", "25", "20", "16.66667", "14.28571", "12.5", "11.11111", "10", "5",
)  # fmt: skip


def split_correct(n: int) -> list[str]:
    """``n`` allowed fractions summing to 100 (Moodle rounds the sum to 2 places).

    An equal split when Moodle has it (1..10 and 20 answers); otherwise the most even mix of two
    allowed values, e.g. 11 answers → nine at 10 and two at 5.
    """
    if n < 1:
        raise ValueError("a multiple-answers item needs at least one correct option")
    values = [float(v) for v in ALLOWED_FRACTIONS]
    by_value = dict(zip(values, ALLOWED_FRACTIONS, strict=True))
    best: tuple[float, list[str]] | None = None
    for a in values:
        for b in values:
            if b > a:
                continue
            for k in range(n + 1):  # k answers at a, the rest at b
                if round(k * a + (n - k) * b, 2) != 100:
                    continue
                spread = a - b if 0 < k < n else 0.0
                if best is None or spread < best[0]:
                    best = (spread, [by_value[a]] * k + [by_value[b]] * (n - k))
    if best is None:
        raise ValueError(f"no allowed Moodle fractions split 100% over {n} correct answers")
    return best[1]


def penalty(n_wrong: int) -> str:
    """A wrong answer's negative fraction: choosing every option then scores at most 0."""
    for v in reversed(ALLOWED_FRACTIONS):  # smallest allowed value that is >= 100/n_wrong
        if float(v) >= 100 / n_wrong - 1e-4:  # 33.33333 stands for a third
            return f"-{v}"
    return "-100"


def _text_el(parent: etree._Element, tag: str, html: str, **attrib: str) -> etree._Element:
    el = sub(parent, tag, format="html", **attrib)
    sub(el, "text").text = etree.CDATA(html)
    return el


def _question(
    root: etree._Element, quiz: Quiz, item: Item, mode: str, style: HtmlStyle
) -> etree._Element:
    src = quiz.source_lang
    kind = "truefalse" if item.type == "true_false" else "multichoice"
    qn = sub(root, "question", type=kind)
    sub(sub(qn, "name"), "text", item.id)  # language-neutral; Moodle shows names to staff only
    _text_el(qn, "questiontext", html_block(pieces(item.prompt, mode, src), style))
    _text_el(qn, "generalfeedback", html_block(pieces(item.explanation, mode, src), style))
    sub(qn, "defaultgrade", format_points(item.points))
    sub(qn, "hidden", "0")
    sub(qn, "idnumber", f"{quiz.id}:{item.id}")

    if item.type == "true_false":
        # Moodle shows its own localised True/False; the answer text must be 'true'/'false'.
        for o in sorted(item.options, key=lambda o: not true_false_value(item, o)):
            ans = sub(
                qn, "answer", fraction="100" if o.correct else "0", format="moodle_auto_format"
            )
            sub(ans, "text", "true" if true_false_value(item, o) else "false")
            fb = o.feedback
            _text_el(ans, "feedback", html_block(pieces(fb, mode, src), style) if fb else "")
        return qn

    single = item.type != "multiple_answers"
    sub(qn, "single", "true" if single else "false")
    # Per question: Moodle shuffles when this and the quiz's "Shuffle within questions" (on by
    # default) are both set, so an item that keeps its written order says false here.
    sub(qn, "shuffleanswers", "true" if shuffles(quiz, item) else "false")
    # Letters follow the displayed position, so they stay meaningful when shuffled, and an
    # unshuffled item's "both a and b" still names the options it was written against.
    sub(qn, "answernumbering", "abc")
    n_wrong = sum(1 for o in item.options if not o.correct)
    shares = iter(split_correct(len(item.correct_ids)) if not single else ["100"])
    for o in item.options:
        # single answer: wrong is 0; multiple answers: wrong is a penalty (§4)
        fraction = next(shares) if o.correct else ("0" if single else penalty(n_wrong))
        ans = _text_el(
            qn, "answer", html_inline(pieces(o.text, mode, src), style), fraction=fraction
        )
        fb = o.feedback
        _text_el(ans, "feedback", html_block(pieces(fb, mode, src), style) if fb else "")
    return qn


def category_path(quiz: Quiz, mode: str) -> str:
    """``$course$/top/<title>``. '/' separates categories, so a '/' in a title is doubled.

    With ``--lang all`` the English title is used: markup (``</span>``) would split the path.
    """
    title = plain(quiz.title, "en" if mode == "all" else mode, quiz.source_lang)
    return "$course$/top/" + title.replace("/", "//")


def export(quiz: Quiz, mode: str, style: HtmlStyle) -> bytes:
    root = etree.Element("quiz")
    cat = sub(root, "question", type="category")
    sub(sub(cat, "category"), "text", category_path(quiz, mode))
    _text_el(cat, "info", html_block(pieces(quiz.description, mode, quiz.source_lang), style))
    for item in quiz.items:
        _question(root, quiz, item, mode, style)
    return xml_bytes(root)
