"""A fixture quiz for the export tests, plus parsers that read exports back.

The fixture covers what the real bank does not: multiple_answers and true_false items (the API
lets instructors create them), a seed prompt in a third language, markup-like characters, a
partial Greek translation, a quiz-wide time limit and unlimited attempts.
"""

from __future__ import annotations

import copy
import io
import re
import zipfile
from typing import Any

from lxml import etree, html

from item_bank import Quiz, Text, load_quiz


def _t(lang: str, text: str, **tr: str) -> dict[str, str]:
    return {"lang": lang, "text": text, **tr}


FIXTURE_DATA: dict[str, Any] = {
    "id": "fixture-quiz",
    "title": _t("sn", "Bvunzo yekuedza", en="Fixture quiz", el="Κουίζ δοκιμής"),
    "description": _t("sn", "Tsananguro", en="A quiz built by the tests."),
    "source_lang": "sn",
    "settings": {"allowed_attempts": None, "shuffle_answers": True, "time_limit_minutes": 20},
    "items": [
        {
            "id": "m1",
            "type": "multiple_choice",
            "points": 1.5,
            "topics": ["attention"],
            # a seed prompt written in English inside a Shona quiz: its lang must stay 'en'
            "prompt": _t("en", "Which is cheaper: Q·Kᵀ < 0 & <b>not</b> bold?"),
            "options": [
                {
                    "id": "a",
                    "text": _t("sn", "Yekutanga <i>", en="First <i>"),
                    "correct": True,
                    "feedback": _t("en", "Correct: first & best.", sn="Ndizvo: yekutanga."),
                },
                {
                    "id": "b",
                    "text": _t("sn", "Yechipiri", en="Second"),
                    "correct": False,
                    "feedback": _t("en", "Second is slower.", sn="Yechipiri inononoka."),
                },
                {
                    "id": "c",
                    "text": _t("sn", "Yechitatu", en="Third"),
                    "correct": False,
                    "feedback": _t("en", "Third is wrong.", sn="Yechitatu haina kururama."),
                },
            ],
            "explanation": _t("en", "First wins by a factor of 2.", sn="Yekutanga inokunda."),
        },
        {
            "id": "r1",
            "type": "multiple_answers",
            "points": 2,
            "topics": ["attention"],
            "prompt": _t("sn", "Sarudza zvese zvakarurama", en="Choose all that apply"),
            "options": [
                {"id": "a", "text": _t("sn", "A1", en="A1 en"), "correct": True},
                {
                    "id": "b",
                    "text": _t("sn", "B1", en="B1 en"),
                    "correct": True,
                    "feedback": _t("en", "B is right.", sn="B yakarurama."),
                },
                {"id": "c", "text": _t("sn", "C1", en="C1 en"), "correct": True},
                {
                    "id": "d",
                    "text": _t("sn", "D1", en="D1 en"),
                    "correct": False,
                    "feedback": _t("en", "D is wrong.", sn="D haina kururama."),
                },
                {
                    "id": "e",
                    "text": _t("sn", "E1", en="E1 en"),
                    "correct": False,
                    "feedback": _t("en", "E is wrong.", sn="E haina kururama.", el="Το E είναι λάθος."),
                },
            ],
            "explanation": _t("en", "A, B and C hold.", sn="A, B na C zvakarurama."),
        },
        {
            "id": "t1",
            "type": "true_false",
            "topics": ["attention"],
            "prompt": _t("sn", "Ring Attention inopfuudza K/V.", en="Ring Attention passes K/V."),
            "options": [
                {
                    "id": "f",
                    "text": _t("sn", "Manyepo", en="False"),
                    "correct": False,
                    "feedback": _t("en", "It does pass K/V blocks.", sn="Inopfuudza mabhuroko eK/V."),
                },
                {"id": "t", "text": _t("sn", "Chokwadi", en="True"), "correct": True},
            ],
            "explanation": _t("en", "K/V blocks rotate around the ring.", sn="K/V inotenderera."),
        },
        {
            "id": "g1",
            "type": "multiple_choice",
            "topics": ["attention"],
            # a Greek seed string in a Shona quiz
            "prompt": _t("el", "Ποιο είναι σωστό;", en="Which is right?"),
            "options": [
                {"id": "a", "text": _t("el", "Άλφα", en="Alpha"), "correct": False,
                 "feedback": _t("en", "Not alpha.", sn="Kwete alpha.")},
                {"id": "b", "text": _t("el", "Βήτα", en="Beta"), "correct": True},
                {"id": "c", "text": _t("el", "Γάμμα", en="Gamma"), "correct": False,
                 "feedback": _t("en", "Not gamma.", sn="Kwete gamma.")},
            ],
            "explanation": _t("en", "Beta it is.", sn="Ibeta."),
        },
    ],
}  # fmt: skip


def fixture_quiz(*, shuffle: bool = True, fixed: tuple[str, ...] = ()) -> Quiz:
    """The fixture; ``shuffle`` is the quiz's shuffle_answers, ``fixed`` items keep their order."""
    data = copy.deepcopy(FIXTURE_DATA)
    data["settings"]["shuffle_answers"] = shuffle
    for item in data["items"]:
        if item["id"] in fixed:
            item["shuffle"] = False
    return load_quiz(data, source="fixture")


# --- reading exports back ---------------------------------------------------------------------

PARSER = etree.XMLParser(no_network=True)


def unzip(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def rezip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


def xml(data: bytes) -> etree._Element:
    return etree.fromstring(data, PARSER)


MLANG_BLOCK = re.compile(r"\{mlang ([a-z_]+)\}(.*?)\{mlang\}", re.S)


def html_langs(fragment: str) -> list[tuple[str, str]]:
    """(lang, text) of every outermost element with ``lang`` in an HTML fragment; ``{mlang}``
    blocks are read the same way, ``other`` standing for English."""
    blocks = MLANG_BLOCK.findall(fragment)
    if blocks:
        return [("en" if lang == "other" else lang, html.fromstring(f"<p>{t}</p>").text_content())
                for lang, t in blocks]  # fmt: skip
    root = html.fragment_fromstring(fragment, create_parent="div")
    return [
        (el.get("lang"), el.text_content())
        for el in root.iter()
        if el.get("lang") and not any(a.get("lang") for a in el.iterancestors())
    ]


def expected(t: Text, mode: str, source_lang: str) -> list[tuple[str, str]]:
    """What a string must look like in a language mode, straight from the model (§5)."""
    if mode == "en":
        return [("en", t.en)]
    if mode == "source":
        return [t.source_form(source_lang)]
    return list(t.variants(source_lang).items())


def sorted_pairs(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """{mlang} puts English last as 'other'; compare the set of versions there."""
    return sorted(pairs)
