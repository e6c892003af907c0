"""Exports read back: every explanation and per-option feedback where each format puts it, the
correct answers wired right, and each string tagged with its actual language (§1–§5)."""

from __future__ import annotations

import pytest
from lxml import etree

from item_bank import Item, Quiz, Text
from service.exports import LANG_MODES, export_quiz
from service.exports._common import answer_idents, true_false_value
from service.exports.moodle_xml import split_correct
from service.exports.qti21 import deliveries
from service.exports.validate import multilang_problems
from tests.service.export_fixtures import expected, html_langs, unzip, xml
from tests.service.test_exports_validation import QUIZZES, quiz_by_id

QTI = "{http://www.imsglobal.org/xsd/ims_qtiasiv1p2}"
Q21 = "{http://www.imsglobal.org/xsd/imsqti_v2p1}"
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"

CASES = [(q, m) for q in QUIZZES for m in LANG_MODES]


def langs_of(fragment: str) -> list[tuple[str, str]]:
    return html_langs(fragment)


def assert_text(fragment: str, t: Text, mode: str, quiz: Quiz) -> None:
    got, want = langs_of(fragment), expected(t, mode, quiz.source_lang)
    # {mlang} writes English last (as 'other'); order is otherwise the model's
    assert got == want or sorted(got) == sorted(want), (got, want)


def _mattext(el: etree._Element) -> str:
    return el.find(f".//{QTI}mattext").text


def _feedback(item_el: etree._Element) -> dict[str, str]:
    return {fb.get("ident"): _mattext(fb) for fb in item_el.iter(f"{QTI}itemfeedback")}


# --- Canvas QTI 1.2 ---------------------------------------------------------------------------


def _canvas_item_checks(quiz: Quiz, item: Item, el: etree._Element, mode: str) -> None:
    ids = {oid: str(n) for oid, n in answer_idents(quiz, item).items()}
    meta = {
        f.findtext(f"{QTI}fieldlabel"): f.findtext(f"{QTI}fieldentry")
        for f in el.iter(f"{QTI}qtimetadatafield")
    }
    assert meta["original_answer_ids"] == ",".join(ids[o.id] for o in item.options)
    assert float(meta["points_possible"]) == item.points
    assert_text(_mattext(el.find(f"{QTI}presentation")), item.prompt, mode, quiz)
    labels = el.findall(f".//{QTI}response_label")
    assert [lb.get("ident") for lb in labels] == [ids[o.id] for o in item.options]
    for lb, o in zip(labels, item.options, strict=True):
        assert_text(_mattext(lb), o.text, mode, quiz)

    fbs = _feedback(el)
    assert_text(fbs["general_fb"], item.explanation, mode, quiz)
    single = item.type != "multiple_answers"
    for o in item.options:
        if o.feedback is None:
            assert f"{ids[o.id]}_fb" not in fbs
        elif o.correct and single:
            assert_text(fbs["correct_fb"], o.feedback, mode, quiz)
        else:
            assert_text(fbs[f"{ids[o.id]}_fb"], o.feedback, mode, quiz)

    rows = el.find(f"{QTI}resprocessing").findall(f"{QTI}respcondition")
    assert el.find(f"{QTI}resprocessing")[0].tag == f"{QTI}outcomes"
    assert rows[0].find(f".//{QTI}other") is not None and rows[0].get("continue") == "Yes"
    scoring = [r for r in rows if r.find(f"{QTI}setvar") is not None]
    assert len(scoring) == 1 and scoring[0].findtext(f"{QTI}setvar") == "100"
    assert scoring[0].get("continue") == "No" and rows.index(scoring[0]) == len(rows) - 1
    cond = scoring[0].find(f"{QTI}conditionvar")
    if single:  # Canvas row #3: varequal is the correct ident
        assert [v.text for v in cond.iter(f"{QTI}varequal")] == [ids[i] for i in item.correct_ids]
    else:
        positive = [v.text for v in cond.xpath("q:and/q:varequal", namespaces={"q": QTI[1:-1]})]
        negative = [
            v.text for v in cond.xpath("q:and/q:not/q:varequal", namespaces={"q": QTI[1:-1]})
        ]
        assert positive == [ids[o.id] for o in item.options if o.correct]
        assert negative == [ids[o.id] for o in item.options if not o.correct]
    for r in rows[1:-1]:  # row #2: per-answer feedback, continue="Yes"
        (v,) = r.iter(f"{QTI}varequal")
        assert r.get("continue") == "Yes"
        assert r.find(f"{QTI}displayfeedback").get("linkrefid") == f"{v.text}_fb"


@pytest.mark.parametrize(("quiz_id", "mode"), CASES)
def test_canvas_qti12_content(quiz_id: str, mode: str) -> None:
    quiz = quiz_by_id(quiz_id)
    files = unzip(export_quiz(quiz, "qti12", mode).data)
    root = xml(files[f"{quiz.id}/{quiz.id}.xml"])
    assert root.tag == f"{QTI}questestinterop"  # namespace kept for New Quizzes
    items = list(root.iter(f"{QTI}item"))
    assert [i.get("ident") for i in items] == [it.id for it in quiz.items]
    for item, el in zip(quiz.items, items, strict=True):
        _canvas_item_checks(quiz, item, el, mode)
    meta = xml(files[f"{quiz.id}/assessment_meta.xml"])
    cv = "{http://canvas.instructure.com/xsd/cccv1p0}"
    assert meta.get("identifier") == quiz.id
    assert float(meta.findtext(f"{cv}points_possible")) == quiz.points_possible
    assert_text(meta.findtext(f"{cv}description"), quiz.description, mode, quiz)
    # Canvas keeps lang but not xml:lang: the HTML carries lang, the XML no xml:lang at all
    assert not root.xpath("//@xml:lang")


# --- Common Cartridge (read the way Moodle's restore reads it) ---------------------------------


def _moodle_cc_feedback(item_el: etree._Element, ident: str) -> list[str]:
    """Moodle's get_feedback: rows whose first conditionvar/varequal is the answer."""
    fbs = _feedback(item_el)
    out = []
    for rc in item_el.iter(f"{QTI}respcondition"):
        v = rc.find(f"{QTI}conditionvar/{QTI}varequal")
        if v is not None and v.text.lower() == ident.lower():
            out += [fbs[d.get("linkrefid")] for d in rc.iter(f"{QTI}displayfeedback")]
    return out


def _moodle_cc_correct(item_el: etree._Element, ident: str, multiple: bool) -> bool:
    if multiple:
        q = {"q": QTI[1:-1]}
        found = item_el.xpath(
            ".//q:setvar[@varname='SCORE'][.=100]/../q:conditionvar//q:varequal[@case='Yes']"
            "[not(parent::q:not)]",
            namespaces=q,
        )
        return ident in {v.text for v in found}
    score = None
    for rc in item_el.iter(f"{QTI}respcondition"):  # the *last* matching row decides
        v = rc.find(f"{QTI}conditionvar/{QTI}varequal")
        if v is not None and v.text.lower() == ident.lower():
            score = rc.findtext(f"{QTI}setvar")
    return bool(score)


@pytest.mark.parametrize(("quiz_id", "mode"), CASES)
def test_cc_content_as_moodle_reads_it(quiz_id: str, mode: str) -> None:
    quiz = quiz_by_id(quiz_id)
    files = unzip(export_quiz(quiz, "imscc", mode).data)
    assert (
        b'xmlns="http://www.imsglobal.org/xsd/imsccv1p1/imscp_v1p1"'
        in files["imsmanifest.xml"][:1024]
    )
    root = xml(files[f"{quiz.id}/assessment_qti.xml"])
    for item, el in zip(quiz.items, root.iter(f"{QTI}item"), strict=True):
        fbs = _feedback(el)
        general = [
            fbs[d.get("linkrefid")]
            for rc in el.iter(f"{QTI}respcondition")
            if rc.get("continue") == "Yes"
            for d in rc.iter(f"{QTI}displayfeedback")
        ]
        assert len(general) == 1  # Moodle concatenates them: only the explanation
        assert_text(general[0], item.explanation, mode, quiz)
        assert_text(
            el.find(f".//{QTI}presentation/{QTI}material/{QTI}mattext").text,
            item.prompt,
            mode,
            quiz,
        )
        labels = {lb.get("ident"): lb for lb in el.iter(f"{QTI}response_label")}
        ints = answer_idents(quiz, item)
        for o in item.options:
            if item.type == "true_false":
                ident = "true" if true_false_value(item, o) else "false"
            else:
                ident = str(ints[o.id])
            assert_text(_mattext(labels[ident]), o.text, mode, quiz)
            got = _moodle_cc_feedback(el, ident)
            if o.feedback is None:
                assert got == []
            else:
                assert len(got) == 1
                assert_text(got[0], o.feedback, mode, quiz)
            assert _moodle_cc_correct(el, ident, item.type == "multiple_answers") == o.correct
        for mt in el.iter(f"{QTI}mattext"):
            assert multilang_problems(mt.text) == []


def test_cc_true_false_idents() -> None:
    quiz = quiz_by_id("fixture-quiz")
    root = xml(unzip(export_quiz(quiz, "imscc", "en").data)["fixture-quiz/assessment_qti.xml"])
    tf = next(el for el in root.iter(f"{QTI}item") if el.get("ident") == "t1")
    assert sorted(lb.get("ident") for lb in tf.iter(f"{QTI}response_label")) == ["false", "true"]
    assert _moodle_cc_correct(tf, "true", False) and not _moodle_cc_correct(tf, "false", False)


# --- QTI 2.1 ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("quiz_id", "mode"), CASES)
def test_qti21_content(quiz_id: str, mode: str) -> None:
    quiz = quiz_by_id(quiz_id)
    src = quiz.source_lang
    files = unzip(export_quiz(quiz, "qti21", mode).data)
    ds = deliveries(quiz, mode)
    if mode == "all":
        assert [d.lang for d in ds][:2] == [src, "en"]
    for d in ds:
        test = xml(files["test.xml" if mode != "all" else f"test-{d.lang}.xml"])
        refs = [r.get("identifier") for r in test.iter(f"{Q21}assessmentItemRef")]
        assert refs == [f"{it.id}{d.suffix}" for it in quiz.items]  # each item once, one language
        for item in quiz.items:
            root = xml(files[f"items/{item.id}{d.suffix}.xml"])
            assert root.get("identifier") == f"{item.id}{d.suffix}"
            assert root.get(XML_LANG) == d.lang

            def want(t: Text, d=d) -> tuple[str, str]:
                if d.lang == "en":
                    return ("en", t.en)
                if d.lang == src:
                    return t.source_form(src)
                return (d.lang, t.get(d.lang))

            def got(el: etree._Element) -> tuple[str, str]:
                return (el.get(XML_LANG), el.text)

            ids = {oid: f"RESPONSE_{n}" for oid, n in answer_idents(quiz, item).items()}
            assert got(root.find(f".//{Q21}prompt")) == want(item.prompt)
            choices = root.findall(f".//{Q21}simpleChoice")
            assert [c.get("identifier") for c in choices] == [ids[o.id] for o in item.options]
            for c, o in zip(choices, item.options, strict=True):
                assert got(c) == want(o.text)
            correct = [v.text for v in root.iter(f"{Q21}correctResponse") for v in v]
            assert correct == [ids[i] for i in item.correct_ids]
            fb = root.find(f"{Q21}outcomeDeclaration[@identifier='FEEDBACK']")
            assert fb.get("cardinality") == "multiple"
            modal = {
                m.get("identifier"): m.find(f"{Q21}p") for m in root.iter(f"{Q21}modalFeedback")
            }
            assert got(modal["general_fb"]) == want(item.explanation)
            single = item.type != "multiple_answers"
            for o in item.options:
                if o.feedback is None:
                    continue
                key = "correct_fb" if (o.correct and single) else f"FEEDBACK_{ids[o.id][9:]}_fb"
                assert got(modal[key]) == want(o.feedback)
            set_ids = {
                b.text for b in root.find(f"{Q21}responseProcessing").iter(f"{Q21}baseValue")
            }
            assert set(modal) <= set_ids  # every feedback can be switched on
            assert not any(m.get(XML_LANG) for m in root.iter(f"{Q21}modalFeedback"))


# --- Moodle XML -------------------------------------------------------------------------------


@pytest.mark.parametrize("mlang", ["spans", "mlang"])
@pytest.mark.parametrize(("quiz_id", "mode"), CASES)
def test_moodle_xml_content(quiz_id: str, mode: str, mlang: str) -> None:
    quiz = quiz_by_id(quiz_id)
    root = xml(export_quiz(quiz, "moodle-xml", mode, mlang=mlang).data)
    cat = root.find("question[@type='category']/category/text").text
    assert cat.startswith("$course$/top/")
    questions = [q for q in root.findall("question") if q.get("type") != "category"]
    assert [q.findtext("name/text") for q in questions] == [it.id for it in quiz.items]
    for item, qn in zip(quiz.items, questions, strict=True):
        assert qn.get("type") == ("truefalse" if item.type == "true_false" else "multichoice")
        assert_text(qn.findtext("questiontext/text"), item.prompt, mode, quiz)
        assert_text(qn.findtext("generalfeedback/text"), item.explanation, mode, quiz)
        assert float(qn.findtext("defaultgrade")) == item.points
        answers = qn.findall("answer")
        if item.type == "true_false":
            by_text = {a.findtext("text"): a for a in answers}
            for o in item.options:
                a = by_text["true" if true_false_value(item, o) else "false"]
                assert a.get("fraction") == ("100" if o.correct else "0")
                if o.feedback:
                    assert_text(a.findtext("feedback/text"), o.feedback, mode, quiz)
            continue
        assert qn.findtext("single") == ("false" if item.type == "multiple_answers" else "true")
        fractions = []
        for a, o in zip(answers, item.options, strict=True):
            assert_text(a.findtext("text"), o.text, mode, quiz)
            if o.feedback:
                assert_text(a.findtext("feedback/text"), o.feedback, mode, quiz)
            fractions.append((float(a.get("fraction")), o.correct))
        if item.type == "multiple_answers":
            assert round(sum(f for f, c in fractions if c), 2) == 100
            assert [f"{f:g}" for f, c in fractions if c] == [
                f"{float(x):g}" for x in split_correct(len(item.correct_ids))
            ]
            assert all(f < 0 for f, c in fractions if not c)
        else:
            assert [c for f, c in fractions if f == 100] == [True]  # fraction 100 on the correct
            assert all(f == 0 for f, c in fractions if not c)
        for el in qn.iter("text"):
            assert multilang_problems(el.text or "") == []


def test_moodle_multilang_spans_adjacency() -> None:
    """§4: double quotes, only whitespace between spans, no nested span: on the raw bytes."""
    import re

    data = export_quiz(quiz_by_id("ring-attention-quiz"), "moodle-xml", "all").data.decode()
    groups = re.findall(
        r"((?:<span lang=\"[a-z_]+\" class=\"multilang\">[^<]*</span>\s*){2,})", data
    )
    assert len(groups) > 8 * 6  # prompt, explanation, 4 answers, 4 feedbacks per item
    assert "class='multilang'" not in data
    for m in re.finditer(r"<span lang=\"[a-z]+\" class=\"multilang\">", data):
        # every multilang span sits in a group of at least two
        assert any(m.group(0) in g for g in groups)


def test_mixed_languages_are_tagged_per_string() -> None:
    """In the fixture (a Shona quiz), m1's prompt is an English seed and g1's a Greek one."""
    quiz = quiz_by_id("fixture-quiz")
    root = xml(export_quiz(quiz, "moodle-xml", "source").data)
    q = {qn.findtext("name/text"): qn for qn in root.findall("question")}
    assert langs_of(q["m1"].findtext("questiontext/text"))[0][0] == "en"
    assert langs_of(q["g1"].findtext("questiontext/text"))[0][0] == "el"
    assert langs_of(q["g1"].findtext("generalfeedback/text"))[0][0] == "sn"
    files = unzip(export_quiz(quiz, "qti21", "all").data)
    prompt = xml(files["items/g1-sn.xml"]).find(f".//{Q21}prompt")
    assert prompt.get(XML_LANG) == "el"  # a Shona delivery shows the Greek seed as written
    # markup-like text is escaped text, not markup
    assert langs_of(q["m1"].findtext("questiontext/text"))[0][1] == quiz.item("m1").prompt.text
