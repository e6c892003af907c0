"""Moodle XML question files (exports.md §4) → a draft quiz.

Reads what ``service/exports/moodle_xml.py`` writes and what Moodle itself exports: multichoice
and truefalse questions; every other question type is named in a warning and skipped.
"""

from __future__ import annotations

from lxml import etree

from service.imports._build import DraftItem, DraftOption, DraftQuiz, note_reduced
from service.imports._safe import ImportFailed, child, child_text, children
from service.imports._text import Pieces, read_html

FORMAT = "Moodle XML"
#: Moodle's text formats that hold HTML (moodle_auto_format allows HTML too).
_HTML_FORMATS = {"html", "moodle_auto_format", ""}
_TRUE = {"true", "1", "yes"}


def _text(draft: DraftQuiz, el: etree._Element | None, label: str) -> Pieces:
    if el is None:
        return []
    raw = child_text(el, "text")
    fmt = (el.get("format") or "").lower()
    reading = read_html(raw, is_html=fmt in _HTML_FORMATS)
    if child(el, "file") is not None and "img" not in reading.reduced:
        draft.warnings.append(f"{label}: embedded files are not imported")
    return note_reduced(draft, label, reading)


def _flag(qn: etree._Element, name: str) -> bool | None:
    value = child_text(qn, name)
    return None if value is None else value.strip().lower() in _TRUE


def category_title(path: str) -> str:
    """The last category of ``$course$/top/A//B`` ('//' is a '/' inside a name)."""
    parts = path.replace("//", "\x00").split("/")
    return parts[-1].replace("\x00", "/").strip() if parts else ""


def _number(raw: str | None) -> float | None:
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def _answers(
    draft: DraftQuiz, qn: etree._Element, label: str
) -> list[tuple[float, Pieces, Pieces]]:
    out = []
    for n, ans in enumerate(children(qn, "answer"), start=1):
        fraction = _number(ans.get("fraction")) or 0.0
        text = _text(draft, ans, f"{label} answer {n}")
        fb = _text(draft, child(ans, "feedback"), f"{label} answer {n} feedback")
        out.append((fraction, text, fb))
    return out


def _unsupported_extras(draft: DraftQuiz, qn: etree._Element, label: str) -> None:
    """Name what the bank cannot hold rather than dropping it silently."""
    lost = []
    for tag in ("correctfeedback", "partiallycorrectfeedback", "incorrectfeedback"):
        el = child(qn, tag)
        if el is not None and (child_text(el, "text") or "").strip():
            lost.append(tag)
    if children(qn, "hint"):
        lost.append("hints")
    if child(qn, "tags") is not None:
        lost.append("tags")
    if lost:
        draft.warnings.append(f"{label}: not carried by the bank: {', '.join(lost)}")


def _question(draft: DraftQuiz, qn: etree._Element, kind: str, name: str) -> DraftItem:
    label = f"question {name!r}"
    idnumber = (child_text(qn, "idnumber") or "").strip()
    quiz_part, _, item_part = idnumber.rpartition(":")
    if quiz_part and draft.id_hint is None:
        draft.id_hint = quiz_part  # the exporter writes <quiz id>:<item id>
    answers = _answers(draft, qn, label)
    _unsupported_extras(draft, qn, label)
    options: list[DraftOption] = []
    if kind == "truefalse":
        item_type = "true_false"
        for fraction, text, fb in answers:
            # Moodle shows its own localised True/False; the file says 'true'/'false'.
            word = " ".join(t for _, t in text).strip().lower()
            shown = "True" if word == "true" else "False" if word == "false" else word
            options.append(DraftOption([("en", shown)], fraction > 0, fb))
        single = True
    else:
        single = _flag(qn, "single") is not False
        item_type = "multiple_choice" if single else "multiple_answers"
        best = max((f for f, _, _ in answers), default=0.0)
        for n, (fraction, text, fb) in enumerate(answers, start=1):
            correct = fraction > 0 and (not single or fraction == best)
            if single and 0 < fraction < best:
                draft.warnings.append(
                    f"{label}: answer {n} gives partial credit ({fraction:g}%); "
                    "the bank has none, so it counts as wrong"
                )
            options.append(DraftOption(text, correct, fb))
    return DraftItem(
        label=name,
        type=item_type,
        prompt=_text(draft, child(qn, "questiontext"), label),
        options=options,
        explanation=_text(draft, child(qn, "generalfeedback"), f"{label} general feedback"),
        id_hint=name if name else item_part or None,
        points=_number(child_text(qn, "defaultgrade"))
        if child(qn, "defaultgrade") is not None
        else 1.0,
        shuffle=_flag(qn, "shuffleanswers") if kind != "truefalse" else None,
    )


def _tag_title(draft: DraftQuiz) -> None:
    """A category name has no markup; the description's languages tell which language it is in.

    kgrade writes the English title when the questions carry every language (a multilang span
    would split the category path), else the one language of the export.
    """
    langs = list(dict.fromkeys(lang for lang, _ in draft.description if lang))
    if not draft.title or not langs:
        return
    ((_, title),) = draft.title
    if len(langs) == 1:
        draft.title = [(langs[0], title)]
    else:
        draft.title = [("en", title)]
        draft.warnings.append(
            "title: a Moodle category name holds one language (English here); "
            "the title's other languages are not in the file"
        )


def read(root: etree._Element) -> DraftQuiz:
    if root.tag != "quiz":
        raise ImportFailed(f"not Moodle XML: the root element is <{root.tag}>, not <quiz>")
    draft = DraftQuiz(format=FORMAT, title=[])
    categories: list[str] = []
    for n, qn in enumerate(children(root, "question"), start=1):
        kind = (qn.get("type") or "").strip()
        if kind == "category":
            path = child_text(qn, "category", "text") or ""
            categories.append(path)
            if not draft.title and category_title(path):
                title = category_title(path)
                draft.title = [(None, title)] if title not in ("top", "$course$") else []
                draft.description = _text(draft, child(qn, "info"), "category info")
            continue
        name = (child_text(qn, "name", "text") or "").strip() or f"#{n}"
        if kind not in ("multichoice", "truefalse"):
            draft.warnings.append(
                f"question {name!r}: type {kind or '(none)'!r} is not supported "
                "(only multichoice and truefalse); skipped"
            )
            continue
        draft.items.append(_question(draft, qn, kind, name))
    _tag_title(draft)
    if len(set(categories)) > 1:
        draft.warnings.append(
            f"{len(set(categories))} categories in the file: their questions become one quiz, "
            "named after the first"
        )
    draft.warnings.append(
        "quiz settings (attempts, time limit, scoring, re-answering) are not in Moodle XML; "
        "the bank's defaults apply"
    )
    return draft
