"""Drafts read from a file → a quiz in the item bank's schema, validated by ``load_quiz``.

Each format module fills a ``DraftQuiz`` with what its file says; this module decides
languages, ids and the bank's required fields, and says in a warning whatever it had to supply
or leave out. The result goes through ``item_bank.schema.load_quiz``, the same validator as the
bank's own YAML files and the API.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from item_bank.model import LANGUAGES, Quiz
from item_bank.schema import ID_RE, BankError, load_quiz
from service.imports._safe import ImportFailed
from service.imports._text import Pieces, Reading

_ID = re.compile(ID_RE)
OPTION_IDS = "abcdefghijklmnopqrstuvwxyz"
#: Every item needs topics, and no LMS format carries them.
IMPORTED_TOPIC = "imported"
NO_FEEDBACK = "No feedback was given for this option in the imported file."
NO_EXPLANATION = "No general feedback was given for this question in the imported file."


@dataclass
class DraftOption:
    text: Pieces
    correct: bool
    feedback: Pieces = field(default_factory=list)


@dataclass
class DraftItem:
    label: str  # how warnings name the item: its id or name in the file
    type: str  # multiple_choice | multiple_answers | true_false
    prompt: Pieces
    options: list[DraftOption]
    explanation: Pieces = field(default_factory=list)
    id_hint: str | None = None
    points: float | None = None
    shuffle: bool | None = None  # None: the file does not say


@dataclass
class DraftQuiz:
    format: str
    title: Pieces
    description: Pieces = field(default_factory=list)
    id_hint: str | None = None
    items: list[DraftItem] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def note_reduced(draft: DraftQuiz, label: str, reading: Reading) -> Pieces:
    """The pieces of ``reading``, with a warning when formatting had to be dropped."""
    tags = sorted(reading.reduced)
    if tags:
        what = "formatting <" + ">, <".join(tags) + ">"
        if "img" in tags:
            what += " (images are not imported)"
        draft.warnings.append(f"{label}: {what} reduced to plain text (the bank stores text)")
    return reading.pieces


def slug_id(raw: str | None) -> str | None:
    """``raw`` as a bank id (letters, digits, '-' and '_', starting with a letter), or None."""
    if not raw:
        return None
    s = re.sub(r"[^A-Za-z0-9_-]+", "-", raw.strip()).strip("-_")
    s = re.sub(r"^[^A-Za-z]+", "", s)[:64].rstrip("-_")
    return s if s and _ID.match(s) else None


class _Langs:
    """Turns pieces into bank texts, counting what had to be filled in for one warning each."""

    def __init__(self, draft: DraftQuiz) -> None:
        self.draft = draft
        counts: Counter[str] = Counter()
        for ps in _all_pieces(draft):
            for lang, _ in ps:
                if lang in LANGUAGES and lang != "en":
                    counts[lang] += 1
        self.source = counts.most_common(1)[0][0] if counts else "en"
        self.unknown: Counter[str] = Counter()
        self.no_en = 0
        self.no_source = 0

    def text(self, ps: Pieces, *, seed: bool, label: str) -> dict[str, str]:
        versions: dict[str, str] = {}
        has_en = any(lang == "en" for lang, _ in ps)
        for lang, text in ps:
            if lang == "other":  # {mlang other}: the exporters' English, else a fallback
                lang = None if has_en else "en"
                if lang is None:
                    continue
            lang = lang or self.source
            if lang not in LANGUAGES:
                self.unknown[lang] += 1
                continue
            versions.setdefault(lang, text)
        if not versions:
            # Only languages the bank does not know: keep the first text rather than nothing.
            versions[self.source] = ps[0][1]
        # A seed string's language is the first the file gives (the exporters put the source
        # form first); kgrade's authored texts (feedback, explanations) are written in English.
        lang = next(iter(versions)) if seed or "en" not in versions else "en"
        if "en" not in versions:
            versions["en"] = versions[lang]
            self.no_en += 1
        if not seed and self.source not in versions:
            versions[self.source] = versions["en"]
            self.no_source += 1
        text = versions.pop(lang)
        return {"lang": lang, "text": text, **versions}

    def report(self) -> None:
        w = self.draft.warnings
        for lang, n in sorted(self.unknown.items()):
            w.append(
                f"language {lang!r} is not one the bank knows ({', '.join(sorted(LANGUAGES))}): "
                f"its text was left out in {n} place(s)"
            )
        if self.no_en:
            w.append(
                f"{self.no_en} text(s) have no English version in the file; their "
                f"{LANGUAGES[self.source]} text stands in for English until translated"
            )
        if self.no_source:
            w.append(
                f"{self.no_source} feedback text(s) have no {LANGUAGES[self.source]} version; "
                "the English text stands in until translated"
            )


def _all_pieces(draft: DraftQuiz) -> list[Pieces]:
    out = [draft.title, draft.description]
    for it in draft.items:
        out += [it.prompt, it.explanation]
        for o in it.options:
            out += [o.text, o.feedback]
    return [p for p in out if p]


def _check_item(it: DraftItem, warn: list[str]) -> str | None:
    """Why an item cannot be kept, or None."""
    if not it.prompt:
        return "it has no question text"
    if len(it.options) < 2:
        return f"it has {len(it.options)} option(s); the bank needs at least two"
    if len(it.options) > len(OPTION_IDS):
        return f"it has {len(it.options)} options; the bank takes at most {len(OPTION_IDS)}"
    if not any(o.correct for o in it.options):
        return "no option is marked correct"
    if it.type == "true_false" and len(it.options) != 2:
        return "a true/false question needs exactly two answers"
    if any(not o.text for o in it.options):
        return "an option has no text"
    return None


def build(draft: DraftQuiz, *, quiz_id: str | None, source: str) -> Quiz:
    """The validated quiz; ``ImportFailed`` when nothing importable remains."""
    w = draft.warnings
    kept: list[DraftItem] = []
    for it in draft.items:
        why = _check_item(it, w)
        if why:
            w.append(f"question {it.label!r}: skipped: {why}")
        else:
            kept.append(it)
    if not kept:
        skipped = [m for m in w if "skipped" in m]
        raise ImportFailed(
            f"{source}: no question in the file can be imported"
            + (f": {'; '.join(skipped[:5])}" if skipped else ""),
            warnings=list(dict.fromkeys(w)),
        )
    draft.items = kept
    langs = _Langs(draft)

    qid = quiz_id or slug_id(draft.id_hint) or slug_id(source.rsplit(".", 1)[0]) or "imported"
    if not _ID.match(qid):
        raise ImportFailed(
            f"quiz id {qid!r} is not valid: letters, digits, '-' and '_', starting with a letter",
            field="quiz_id",
        )
    title_ps = draft.title or [(None, qid)]
    if not draft.title:
        w.append(f"title: the file gives none; the quiz id {qid!r} stands in")
    desc_ps = draft.description
    if not desc_ps:
        desc_ps = title_ps
        w.append(f"description: none in the {draft.format} file; the title stands in")

    items: list[dict[str, Any]] = []
    used: set[str] = set()
    any_shuffle = any(it.shuffle is not False for it in kept)
    missing_fb: list[str] = []
    for n, it in enumerate(kept, start=1):
        iid = slug_id(it.id_hint)
        if iid is None or iid in used:
            iid = f"q{n}"
            while iid in used:
                iid += "x"
        used.add(iid)
        label = f"question {it.label!r}"
        points = it.points
        if points is None or not 0 < points <= 1000:
            w.append(f"{label}: points {points!r} are not usable; 1 point used")
            points = 1.0
        if not it.explanation:
            w.append(f"{label}: no general feedback in the file; a placeholder stands in")
        options = []
        for oid, o in zip(OPTION_IDS, it.options, strict=False):
            opt: dict[str, Any] = {
                "id": oid,
                "text": langs.text(o.text, seed=True, label=label),
                "correct": o.correct,
            }
            if o.feedback:
                opt["feedback"] = langs.text(o.feedback, seed=False, label=label)
            elif not o.correct:
                missing_fb.append(it.label)
                opt["feedback"] = langs.text([("en", NO_FEEDBACK)], seed=False, label=label)
            options.append(opt)
        n_correct = sum(o.correct for o in it.options)
        kind = "multiple_answers" if n_correct > 1 else it.type
        items.append(
            {
                "id": iid,
                "type": kind,
                "points": points,
                "topics": [IMPORTED_TOPIC],
                "prompt": langs.text(it.prompt, seed=True, label=label),
                "options": options,
                "explanation": langs.text(
                    it.explanation or [("en", NO_EXPLANATION)], seed=False, label=label
                ),
                # The quiz-wide flag is on when any question shuffles; the rest opt out.
                "shuffle": it.shuffle is not False if any_shuffle else True,
            }
        )
    for label in dict.fromkeys(missing_fb):
        w.append(f"question {label!r}: a wrong answer has no feedback; a placeholder stands in")
    w.append(f"topics: not carried by {draft.format}; every question has the topic 'imported'")
    settings = dict(draft.settings)
    if any(it.shuffle is not None for it in kept):
        # Per-question flags say more than a quiz-wide one (Canvas's is "every item shuffles").
        settings["shuffle_answers"] = any_shuffle
    data = {
        "id": qid,
        "title": langs.text(title_ps, seed=True, label="title"),
        "description": langs.text(desc_ps, seed=True, label="description"),
        "source_lang": langs.source,
        "settings": settings,
        "items": items,
    }
    langs.report()
    try:
        return load_quiz(data, source=source)
    except BankError as exc:  # a case the checks above missed: still a 4xx, never a 500
        raise ImportFailed("; ".join(exc.messages[:5])) from None
