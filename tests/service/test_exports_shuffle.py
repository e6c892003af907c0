"""Issue 17 §2 and §3 in the exports: each format's own shuffle flag per item (the quiz setting
off: none shuffles; an item with ``shuffle: false``: never shuffles, and keeps its written order),
and a QTI 2.1 package with ``--lang all`` that asks each question once per test."""

from __future__ import annotations

from pathlib import Path

import pytest
from lxml import etree

from item_bank import Item, Quiz
from service.exports import LANG_MODES, export_quiz
from service.exports._common import answer_idents
from service.exports.qti21 import deliveries
from service.exports.validate import validate_export
from tests.service.export_fixtures import fixture_quiz, html_langs, rezip, unzip, xml
from tests.service.test_exports_validation import QUIZZES, quiz_by_id

QTI = "{http://www.imsglobal.org/xsd/ims_qtiasiv1p2}"
Q21 = "{http://www.imsglobal.org/xsd/imsqti_v2p1}"
CP = "{http://www.imsglobal.org/xsd/imscp_v1p1}"
CANVAS = "{http://canvas.instructure.com/xsd/cccv1p0}"
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"

#: (quiz shuffles, items that keep their order): every combination of the two rules.
VARIANTS = [(True, ()), (True, ("m1", "r1")), (False, ()), (False, ("m1",))]


def expected_flags(quiz: Quiz) -> dict[str, bool]:
    return {it.id: quiz.settings.shuffle_answers and it.shuffle for it in quiz.items}


def written_idents(quiz: Quiz, item: Item) -> list[str]:
    ints = answer_idents(quiz, item)
    return [str(ints[o.id]) for o in item.options]


def _qti12_flags(root: etree._Element) -> dict[str, bool]:
    out = {}
    for item in root.iter(f"{QTI}item"):
        (rc,) = item.iter(f"{QTI}render_choice")
        assert rc.get("shuffle") in ("Yes", "No")
        out[item.get("ident")] = rc.get("shuffle") == "Yes"
    return out


@pytest.mark.parametrize(("shuffle", "fixed"), VARIANTS)
def test_canvas_flags_per_item_and_quiz(shuffle: bool, fixed: tuple[str, ...]) -> None:
    quiz = fixture_quiz(shuffle=shuffle, fixed=fixed)
    files = unzip(export_quiz(quiz, "qti12", "en").data)
    root = xml(files["fixture-quiz/fixture-quiz.xml"])
    assert _qti12_flags(root) == expected_flags(quiz)
    # Classic shuffles per quiz only, so an item that keeps its order turns it off for all
    meta = xml(files["fixture-quiz/assessment_meta.xml"])
    assert meta.findtext(f"{CANVAS}shuffle_answers") == (
        "true" if shuffle and not fixed else "false"
    )
    for item, el in zip(quiz.items, root.iter(f"{QTI}item"), strict=True):
        if item.id in fixed:  # written order, which the letters in its options refer to
            idents = [lb.get("ident") for lb in el.iter(f"{QTI}response_label")]
            assert idents == written_idents(quiz, item)


@pytest.mark.parametrize(("shuffle", "fixed"), VARIANTS)
def test_cc_flags_per_item(shuffle: bool, fixed: tuple[str, ...]) -> None:
    quiz = fixture_quiz(shuffle=shuffle, fixed=fixed)
    files = unzip(export_quiz(quiz, "imscc", "all").data)
    assert _qti12_flags(xml(files["fixture-quiz/assessment_qti.xml"])) == expected_flags(quiz)


@pytest.mark.parametrize("mode", LANG_MODES)
@pytest.mark.parametrize(("shuffle", "fixed"), VARIANTS)
def test_qti21_flags_per_item(shuffle: bool, fixed: tuple[str, ...], mode: str) -> None:
    quiz = fixture_quiz(shuffle=shuffle, fixed=fixed)
    files = unzip(export_quiz(quiz, "qti21", mode).data)
    for d in deliveries(quiz, mode):
        flags = {}
        for item in quiz.items:
            root = xml(files[f"items/{item.id}{d.suffix}.xml"])
            (ci,) = root.iter(f"{Q21}choiceInteraction")
            flags[item.id] = {"true": True, "false": False}[ci.get("shuffle")]
            if item.id in fixed:
                choices = [c.get("identifier") for c in ci.iter(f"{Q21}simpleChoice")]
                assert choices == [f"RESPONSE_{n}" for n in written_idents(quiz, item)]
        assert flags == expected_flags(quiz)


@pytest.mark.parametrize(("shuffle", "fixed"), VARIANTS)
def test_moodle_flags_per_question(shuffle: bool, fixed: tuple[str, ...]) -> None:
    quiz = fixture_quiz(shuffle=shuffle, fixed=fixed)
    root = xml(export_quiz(quiz, "moodle-xml", "en").data)
    questions = {q.findtext("name/text"): q for q in root.iter("question")}
    for item in quiz.items:
        qn = questions[item.id]
        if item.type == "true_false":  # Moodle's truefalse has no such flag
            assert qn.find("shuffleanswers") is None
            continue
        want = expected_flags(quiz)[item.id]
        assert qn.findtext("shuffleanswers") == ("true" if want else "false")
        assert qn.findtext("answernumbering") == "abc"
        if item.id in fixed:
            texts = [html_langs(a.findtext("text"))[0][1] for a in qn.findall("answer")]
            assert texts == [o.text.en for o in item.options]


@pytest.mark.parametrize("quiz_id", QUIZZES[:2])
def test_the_real_quizzes_shuffle_in_every_format(quiz_id: str) -> None:
    """Both course quizzes ask for shuffling (issue 17 §2): every export carries it."""
    quiz = quiz_by_id(quiz_id)
    assert quiz.settings.shuffle_answers
    want = expected_flags(quiz)
    assert any(want.values())
    files = unzip(export_quiz(quiz, "qti12", "en").data)
    assert _qti12_flags(xml(files[f"{quiz_id}/{quiz_id}.xml"])) == want
    moodle = xml(export_quiz(quiz, "moodle-xml", "all").data)
    got = {q.findtext("name/text"): q.findtext("shuffleanswers") == "true"
           for q in moodle.iter("question") if q.get("type") == "multichoice"}  # fmt: skip
    assert got == {k: v for k, v in want.items() if k in got}


@pytest.mark.parametrize("fmt", ["qti12", "qti21", "imscc", "moodle-xml"])
@pytest.mark.parametrize(("shuffle", "fixed"), VARIANTS)
def test_variants_validate(
    shuffle: bool, fixed: tuple[str, ...], fmt: str, schemas_dir: Path
) -> None:
    out = export_quiz(fixture_quiz(shuffle=shuffle, fixed=fixed), fmt, "all")
    assert validate_export(fmt, out.data, schemas_dir) == []


# --- QTI 2.1: one question asked once --------------------------------------------------------


@pytest.mark.parametrize("quiz_id", QUIZZES)
def test_qti21_all_is_one_test_per_language(quiz_id: str) -> None:
    quiz = quiz_by_id(quiz_id)
    ds = deliveries(quiz, "all")
    assert len(ds) >= 2
    files = unzip(export_quiz(quiz, "qti21", "all").data)
    manifest = xml(files["imsmanifest.xml"])
    resources = {r.get("identifier"): r for r in manifest.iter(f"{CP}resource")}
    tests = [r for r in resources.values() if r.get("type") == "imsqti_test_xmlv2p1"]
    assert [t.get("href") for t in tests] == [f"test-{d.lang}.xml" for d in ds]
    titles = set()
    for d, res in zip(ds, tests, strict=True):
        assert res.get("identifier") == f"{quiz.id}-test-{d.lang}"
        test = xml(files[res.get("href")])
        assert test.get("identifier") == f"{quiz.id}-{d.lang}"
        titles.add(test.get("title"))
        refs = [r.get("href") for r in test.iter(f"{Q21}assessmentItemRef")]
        # each question once: as many refs as the quiz has items, not one per language
        assert len(refs) == len(quiz.items) == len(set(refs))
        items = [xml(files[h]) for h in refs]
        assert [i.get("title") for i in items] == [it.id for it in quiz.items]
        assert {i.get(XML_LANG) for i in items} == {d.lang}
        deps = [resources[x.get("identifierref")] for x in res.iter(f"{CP}dependency")]
        assert [r.get("href") for r in deps] == refs  # the manifest names exactly its items
        assert all(r.get("identifier").endswith(f"-{d.lang}") for r in deps)
        # the test's maximum is the quiz's points, once
        maxima = [
            float(i.find(f"{Q21}outcomeDeclaration[@identifier='MAXSCORE']//{Q21}value").text)
            for i in items
        ]
        assert sum(maxima) == quiz.points_possible
        ops = test.find(f"{Q21}outcomeProcessing")
        summed = [
            s.get("identifier") for s in ops if s.find(f"{Q21}sum/{Q21}testVariables") is not None
        ]
        assert summed == ["SCORE", "MAXSCORE"]
    assert len(titles) == len(ds)  # an LMS lists the imported tests apart
    n_items = sum(r.get("type") == "imsqti_item_xmlv2p1" for r in resources.values())
    assert n_items == len(ds) * len(quiz.items)


def _merged_package(data: bytes, quiz: Quiz, langs: tuple[str, str]) -> bytes:
    """The old layout: the second language's items added to the first language's test."""
    first, second = langs
    files = unzip(data)
    test = xml(files[f"test-{first}.xml"])
    section = test.find(f".//{Q21}assessmentSection")
    for ref in xml(files[f"test-{second}.xml"]).iter(f"{Q21}assessmentItemRef"):
        section.append(ref)
    files[f"test-{first}.xml"] = etree.tostring(test, xml_declaration=True, encoding="UTF-8")
    manifest = xml(files["imsmanifest.xml"])
    res = {r.get("identifier"): r for r in manifest.iter(f"{CP}resource")}
    keep = res[f"{quiz.id}-test-{first}"]
    for dep in res[f"{quiz.id}-test-{second}"].findall(f"{CP}dependency"):
        keep.append(dep)
    gone = res[f"{quiz.id}-test-{second}"]
    gone.getparent().remove(gone)
    del files[f"test-{second}.xml"]
    files["imsmanifest.xml"] = etree.tostring(manifest, xml_declaration=True, encoding="UTF-8")
    return rezip(files)


def test_validator_refuses_a_question_asked_twice(schemas_dir: Path) -> None:
    quiz = quiz_by_id("ring-attention-quiz")
    data = export_quiz(quiz, "qti21", "all").data
    problems = validate_export("qti21", _merged_package(data, quiz, ("sn", "en")), schemas_dir)
    assert any("test-sn.xml" in p and "several languages" in p for p in problems), problems

    files = unzip(data)
    test = xml(files["test-en.xml"])
    section = test.find(f".//{Q21}assessmentSection")
    twin = etree.fromstring(etree.tostring(section[0]))
    twin.set("identifier", "again")
    section.append(twin)
    files["test-en.xml"] = etree.tostring(test, xml_declaration=True, encoding="UTF-8")
    problems = validate_export("qti21", rezip(files), schemas_dir)
    assert any("asked more than once" in p for p in problems), problems

    files = unzip(data)
    manifest = xml(files["imsmanifest.xml"])
    dep = next(manifest.iter(f"{CP}dependency"))
    dep.getparent().remove(dep)
    files["imsmanifest.xml"] = etree.tostring(manifest, xml_declaration=True, encoding="UTF-8")
    problems = validate_export("qti21", rezip(files), schemas_dir)
    assert any("belong to no test" in p for p in problems), problems
    assert any("not its item refs" in p for p in problems), problems
