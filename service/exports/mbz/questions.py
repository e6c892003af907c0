"""``questions.xml``: the quiz's question bank as Moodle 4.5 backs it up.

The layout is Moodle's own (backup/moodle2/backup_stepslib.php, backup_questions_structure_step,
and each qtype's backup plugin): category → question_bank_entry → question_versions → question,
with the qtype's answers and options inside ``plugin_qtype_<type>_question``. The texts are the
same HTML the Moodle XML export writes, so multilang spans or {mlang} work the same way.
"""

from __future__ import annotations

from lxml import etree

from item_bank.model import Item, Quiz
from service.exports._common import (
    HtmlStyle,
    html_block,
    html_inline,
    pieces,
    plain,
    shuffles,
    sub,
    true_false_value,
)
from service.exports.mbz.layout import (
    BACKUP_TIME,
    CONTEXT_COURSE,
    COURSE_CONTEXT_ID,
    COURSE_ID,
    NULL,
    QUIZ_CATEGORY_ID,
    TOP_CATEGORY_ID,
    fields,
    fraction,
    mark,
)
from service.exports.moodle_xml import penalty, split_correct

HTML = "1"  # FORMAT_HTML
AUTO = "0"  # FORMAT_MOODLE: Moodle's own truefalse answers ('True'/'False') are stored so
ADMIN = "2"  # createdby/modifiedby: restore maps them to the restoring user when users are absent


def category_stamp(quiz: Quiz) -> str:
    """Restore reuses a category with the same stamp in the target course (restore_dbops), so
    restoring a quiz twice into one course shares one bank; a new quiz revision gets its own."""
    return f"kgrade+{quiz.id}+r{quiz.revision}"


def question_stamp(quiz: Quiz, item: Item) -> str:
    return f"kgrade+{quiz.id}+{item.id}+r{item.revision}"


def _category(
    root: etree._Element, cid: int, name: str, info: str, stamp: str, parent: int
) -> etree._Element:
    cat = sub(root, "question_category", id=str(cid))
    fields(
        cat,
        [
            ("name", name),
            ("contextid", str(COURSE_CONTEXT_ID)),
            ("contextlevel", CONTEXT_COURSE),
            ("contextinstanceid", str(COURSE_ID)),
            ("info", info),
            ("infoformat", HTML),
            ("stamp", stamp),
            ("parent", str(parent)),
            ("sortorder", "0" if parent == 0 else "999"),
            ("idnumber", NULL),
        ],
    )
    return sub(cat, "question_bank_entries")


def _answer(
    parent: etree._Element, aid: int, text: str, fmt: str, frac: str, feedback: str
) -> None:
    ans = sub(parent, "answer", id=str(aid))
    fields(
        ans,
        [
            ("answertext", text),
            ("answerformat", fmt),
            ("fraction", fraction(frac)),
            ("feedback", feedback),
            ("feedbackformat", HTML),
        ],
    )


class _Ids:
    """Answer ids across the whole file (question_answers rows are one table in Moodle)."""

    def __init__(self) -> None:
        self.answer = 0

    def next_answer(self) -> int:
        self.answer += 1
        return self.answer


def _truefalse(
    plugin: etree._Element, quiz: Quiz, item: Item, mode: str, style: HtmlStyle, ids: _Ids
) -> None:
    src = quiz.source_lang
    answers = sub(plugin, "answers")
    by_value: dict[bool, int] = {}
    # True first, as Moodle's own truefalse question stores them.
    for o in sorted(item.options, key=lambda o: not true_false_value(item, o)):
        value = true_false_value(item, o)
        aid = ids.next_answer()
        by_value[value] = aid
        fb = html_block(pieces(o.feedback, mode, src), style) if o.feedback else ""
        _answer(answers, aid, "True" if value else "False", AUTO, "100" if o.correct else "0", fb)
    tf = sub(plugin, "truefalse", id=str(ids.answer))
    fields(
        tf,
        [
            ("trueanswer", str(by_value[True])),
            ("falseanswer", str(by_value[False])),
            ("showstandardinstruction", "0"),
        ],
    )


def _multichoice(
    plugin: etree._Element, quiz: Quiz, item: Item, mode: str, style: HtmlStyle, ids: _Ids
) -> None:
    src = quiz.source_lang
    single = item.type != "multiple_answers"
    answers = sub(plugin, "answers")
    n_wrong = sum(1 for o in item.options if not o.correct)
    # The same grades as the Moodle XML export: shares of 100 % for the right options and, with
    # several right answers, a penalty per wrong one so that ticking everything earns nothing.
    shares = iter(split_correct(len(item.correct_ids)) if not single else ["100"])
    for o in item.options:
        frac = next(shares) if o.correct else ("0" if single else penalty(n_wrong))
        fb = html_block(pieces(o.feedback, mode, src), style) if o.feedback else ""
        text = html_inline(pieces(o.text, mode, src), style)
        _answer(answers, ids.next_answer(), text, HTML, frac, fb)
    mc = sub(plugin, "multichoice", id=str(ids.answer))
    fields(
        mc,
        [
            ("layout", "0"),
            ("single", "1" if single else "0"),
            # Moodle shuffles when this and the quiz's shuffleanswers are both on.
            ("shuffleanswers", "1" if shuffles(quiz, item) else "0"),
            ("correctfeedback", ""),
            ("correctfeedbackformat", HTML),
            ("partiallycorrectfeedback", ""),
            ("partiallycorrectfeedbackformat", HTML),
            ("incorrectfeedback", ""),
            ("incorrectfeedbackformat", HTML),
            ("answernumbering", "abc"),
            ("shownumcorrect", "0" if single else "1"),
            ("showstandardinstruction", "1"),
        ],
    )


def _question(
    entries: etree._Element,
    n: int,
    quiz: Quiz,
    item: Item,
    mode: str,
    style: HtmlStyle,
    ids: _Ids,
) -> None:
    src = quiz.source_lang
    qtype = "truefalse" if item.type == "true_false" else "multichoice"
    entry = sub(entries, "question_bank_entry", id=str(n))
    fields(
        entry,
        [
            ("questioncategoryid", str(QUIZ_CATEGORY_ID)),
            ("idnumber", f"{quiz.id}:{item.id}"),
            ("ownerid", ADMIN),
        ],
    )
    version = sub(sub(entry, "question_version"), "question_versions", id=str(n))
    fields(version, [("version", "1"), ("status", "ready")])
    qn = sub(sub(version, "questions"), "question", id=str(n))
    fields(
        qn,
        [
            ("parent", "0"),
            ("name", item.id),  # language-neutral; Moodle shows names to staff only
            ("questiontext", html_block(pieces(item.prompt, mode, src), style)),
            ("questiontextformat", HTML),
            ("generalfeedback", html_block(pieces(item.explanation, mode, src), style)),
            ("generalfeedbackformat", HTML),
            ("defaultmark", mark(item.points)),
            # Moodle's defaults; only adaptive/interactive behaviours read them.
            ("penalty", "1.0000000" if qtype == "truefalse" else "0.3333333"),
            ("qtype", qtype),
            ("length", "1"),
            ("stamp", question_stamp(quiz, item)),
            ("timecreated", BACKUP_TIME),
            ("timemodified", BACKUP_TIME),
            ("createdby", ADMIN),
            ("modifiedby", ADMIN),
        ],
    )
    plugin = sub(qn, f"plugin_qtype_{qtype}_question")
    if qtype == "truefalse":
        _truefalse(plugin, quiz, item, mode, style, ids)
    else:
        _multichoice(plugin, quiz, item, mode, style, ids)
    sub(qn, "question_hints", "")
    sub(qn, "tags", "")


def category_name(quiz: Quiz, mode: str) -> str:
    """The bank category's name: the quiz title, English with ``--lang all`` as for Moodle XML
    (the category path there cannot hold markup; one name in both keeps them recognisable)."""
    return plain(quiz.title, "en" if mode == "all" else mode, quiz.source_lang)


def build(quiz: Quiz, mode: str, style: HtmlStyle) -> etree._Element:
    root = etree.Element("question_categories")
    # Every course bank has a 'top' category; restore maps this one onto the target's own.
    _category(root, TOP_CATEGORY_ID, "top", "", f"kgrade+{quiz.id}+top", 0)
    entries = _category(
        root,
        QUIZ_CATEGORY_ID,
        category_name(quiz, mode),
        html_block(pieces(quiz.description, mode, quiz.source_lang), style),
        category_stamp(quiz),
        TOP_CATEGORY_ID,
    )
    ids = _Ids()
    for n, item in enumerate(quiz.items, start=1):
        _question(entries, n, quiz, item, mode, style, ids)
    return root
