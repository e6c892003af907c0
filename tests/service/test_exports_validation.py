"""Every export of both real quizzes and the fixture passes the official schemas (§6), twice
over byte-identically; and deliberately broken files fail, so the validators can fail."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from lxml import etree

from item_bank import Quiz, get_quiz
from service.exports import FORMATS, LANG_MODES, ExportFile, export_quiz
from service.exports.moodle_xml import ALLOWED_FRACTIONS, penalty, split_correct
from service.exports.validate import Schemas, load_schemas, validate_export
from tests.service.export_fixtures import fixture_quiz, rezip, unzip, xml

REAL = ("ring-attention-quiz", "sparse-attention-quiz")
QUIZZES = (*REAL, "fixture-quiz")


def quiz_by_id(quiz_id: str) -> Quiz:
    return fixture_quiz() if quiz_id == "fixture-quiz" else get_quiz(quiz_id)


@pytest.fixture(scope="session")
def schemas(schemas_dir: Path) -> Schemas:
    """Compile every schema once for the whole session (the QTI 2.1 XSD alone takes ~1 s)."""
    s = load_schemas(str(schemas_dir))
    for name in (
        "qti21",
        "imscp",
        "cc_manifest",
        "cc_qti",
        "canvas_meta",
        "qti12_dtd",
        "cc_schematron",
    ):
        getattr(s, name)
    return s


def test_real_bank_has_both_quizzes() -> None:
    for quiz_id in REAL:
        quiz = get_quiz(quiz_id)
        assert len(quiz.items) == 8


@pytest.mark.parametrize("lang", LANG_MODES)
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("quiz_id", QUIZZES)
def test_export_validates_and_is_deterministic(
    quiz_id: str, fmt: str, lang: str, schemas: Schemas, schemas_dir: Path
) -> None:
    quiz = quiz_by_id(quiz_id)
    first = export_quiz(quiz, fmt, lang)
    assert validate_export(fmt, first.data, schemas_dir) == []
    again = export_quiz(quiz_by_id(quiz_id), fmt, lang)
    assert again == first  # same bank → byte-identical file, same name and media type
    assert first.media_type == FORMATS[fmt][0]
    assert first.filename == f"{quiz_id}-{fmt}-{lang}{FORMATS[fmt][1]}"


@pytest.mark.parametrize("fmt", ["moodle-xml", "imscc"])
@pytest.mark.parametrize("quiz_id", QUIZZES)
def test_mlang_syntax_validates(
    quiz_id: str, fmt: str, schemas: Schemas, schemas_dir: Path
) -> None:
    out = export_quiz(quiz_by_id(quiz_id), fmt, "all", mlang="mlang")
    assert out.filename.endswith(f"-all-mlang{FORMATS[fmt][1]}")
    assert validate_export(fmt, out.data, schemas_dir) == []
    assert b"{mlang other}" in (
        out.data if fmt == "moodle-xml" else b"".join(unzip(out.data).values())
    )


def test_zip_entries_are_fixed() -> None:
    import io
    import zipfile

    data = export_quiz(fixture_quiz(), "qti12", "en").data
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = zf.infolist()
    assert [i.filename for i in infos][0] == "imsmanifest.xml"
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {i.external_attr >> 16 for i in infos} == {0o100644}


@pytest.mark.parametrize(
    ("fmt", "lang", "mlang", "needle"),
    [("qti13", "en", "spans", "format"), ("qti12", "fr", "spans", "language"),
     ("moodle-xml", "all", "curly", "mlang")],
)  # fmt: skip
def test_bad_requests_raise_value_error(fmt: str, lang: str, mlang: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as info:
        export_quiz(fixture_quiz(), fmt, lang, mlang=mlang)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("n", range(1, 27))
def test_split_correct_uses_allowed_fractions(n: int) -> None:
    if n > 20:  # the smallest positive fraction is 5 %: 21 correct answers cannot sum to 100
        with pytest.raises(ValueError, match="no allowed Moodle fractions"):
            split_correct(n)
        return
    parts = split_correct(n)
    assert len(parts) == n
    assert set(parts) <= set(ALLOWED_FRACTIONS)
    assert round(sum(float(p) for p in parts), 2) == 100


def test_penalty_is_allowed_and_bounded() -> None:
    for n in range(1, 26):
        p = penalty(n)
        assert p.lstrip("-") in ALLOWED_FRACTIONS
        assert float(p) * n <= -100 + 1e-3  # choosing every wrong option cancels full marks


# --- the validators fail on broken files ------------------------------------------------------


def _edit(out: ExportFile, name: str, fn: Callable[[etree._Element], None]) -> bytes:
    files = unzip(out.data)
    root = xml(files[name])
    fn(root)
    files[name] = etree.tostring(root, xml_declaration=True, encoding="UTF-8")
    return rezip(files)


QTI = "{http://www.imsglobal.org/xsd/ims_qtiasiv1p2}"
Q21 = "{http://www.imsglobal.org/xsd/imsqti_v2p1}"


def _q_xml(quiz_id: str) -> str:
    return f"{quiz_id}/{quiz_id}.xml"


def test_broken_canvas_qti_fails(schemas: Schemas, schemas_dir: Path) -> None:
    out = export_quiz(get_quiz("ring-attention-quiz"), "qti12", "en")

    def drop_ident(root: etree._Element) -> None:
        del root.find(f".//{QTI}response_lid").attrib["ident"]  # required by DTD and XSD

    problems = validate_export(
        "qti12", _edit(out, _q_xml("ring-attention-quiz"), drop_ident), schemas_dir
    )
    assert any("ident" in p and "ring-attention-quiz.xml" in p for p in problems)

    def word_ident(root: etree._Element) -> None:
        root.find(f".//{QTI}response_label").set("ident", "correct1")

    problems = validate_export(
        "qti12", _edit(out, _q_xml("ring-attention-quiz"), word_ident), schemas_dir
    )
    assert any("not a positive integer" in p for p in problems)

    def swap_rows(root: etree._Element) -> None:
        rp = root.find(f".//{QTI}resprocessing")
        rows = rp.findall(f"{QTI}respcondition")
        rp.remove(rows[-1])
        rp.insert(1, rows[-1])  # scoring row before general_fb

    problems = validate_export(
        "qti12", _edit(out, _q_xml("ring-attention-quiz"), swap_rows), schemas_dir
    )
    assert any("Canvas's order" in p for p in problems)


def test_missing_file_and_bad_meta_fail(schemas: Schemas, schemas_dir: Path) -> None:
    out = export_quiz(get_quiz("ring-attention-quiz"), "qti12", "en")
    files = unzip(out.data)
    del files["ring-attention-quiz/assessment_meta.xml"]
    assert any(
        "is not in the package" in p for p in validate_export("qti12", rezip(files), schemas_dir)
    )

    def bogus(root: etree._Element) -> None:
        etree.SubElement(root, "{http://canvas.instructure.com/xsd/cccv1p0}bogus").text = "x"

    meta = "ring-attention-quiz/assessment_meta.xml"
    assert any(meta in p for p in validate_export("qti12", _edit(out, meta, bogus), schemas_dir))


def test_broken_cc_fails_schematron_and_detection(schemas: Schemas, schemas_dir: Path) -> None:
    out = export_quiz(get_quiz("sparse-attention-quiz"), "imscc", "en")

    def bad_profile(root: etree._Element) -> None:
        root.find(f".//{QTI}itemmetadata//{QTI}fieldentry").text = "cc.matching.v0p1"

    problems = validate_export(
        "imscc", _edit(out, "sparse-attention-quiz/assessment_qti.xml", bad_profile), schemas_dir
    )
    assert any("RULE 2b" in p for p in problems)

    def general_row(root: etree._Element) -> None:
        for rc in root.iter(f"{QTI}respcondition"):
            rc.set("continue", "Yes")

    problems = validate_export(
        "imscc", _edit(out, "sparse-attention-quiz/assessment_qti.xml", general_row), schemas_dir
    )
    assert any('continue="Yes"' in p for p in problems)

    files = unzip(out.data)
    files["imsmanifest.xml"] = files["imsmanifest.xml"].replace(
        b'xmlns="http://www.imsglobal.org/xsd/imsccv1p1/imscp_v1p1"',
        b'xmlns:cc="http://www.imsglobal.org/xsd/imsccv1p1/imscp_v1p1"',
    )
    problems = validate_export("imscc", rezip(files), schemas_dir)
    assert any("first 1024 bytes" in p for p in problems)


def test_broken_qti21_fails(schemas: Schemas, schemas_dir: Path) -> None:
    out = export_quiz(get_quiz("ring-attention-quiz"), "qti21", "all")

    def lang_on_feedback(root: etree._Element) -> None:
        root.find(f"{Q21}modalFeedback").set("{http://www.w3.org/XML/1998/namespace}lang", "en")

    problems = validate_export(
        "qti21", _edit(out, "items/q1-sn.xml", lang_on_feedback), schemas_dir
    )
    assert any("items/q1-sn.xml" in p and "lang" in p for p in problems)

    def lang_on_test(root: etree._Element) -> None:
        root.set("{http://www.w3.org/XML/1998/namespace}lang", "en")

    assert any(
        "test-en.xml" in p
        for p in validate_export("qti21", _edit(out, "test-en.xml", lang_on_test), schemas_dir)
    )


def test_broken_moodle_xml_fails() -> None:
    data = export_quiz(fixture_quiz(), "moodle-xml", "all").data
    assert validate_export("moodle-xml", data) == []
    root = xml(data)
    mr = root.xpath("//question[single='false']")[0]
    mr.find("answer").set("fraction", "42")
    assert any("'42'" in p for p in validate_export("moodle-xml", etree.tostring(root)))

    root = xml(data)
    qt = root.xpath("question[name/text='r1']/questiontext/text")[0]
    qt.text = etree.CDATA(qt.text.replace('class="multilang"', "class='multilang'", 1))
    assert any(
        "multilang span not written" in p
        for p in validate_export("moodle-xml", etree.tostring(root))
    )

    root = xml(data)
    qt = root.xpath("question[name/text='r1']/questiontext/text")[0]
    qt.text = etree.CDATA(qt.text.replace("</span><span", "</span> x <span", 1))
    assert any(
        "lone multilang span" in p for p in validate_export("moodle-xml", etree.tostring(root))
    )

    root = xml(data)
    tf = root.find("question[@type='truefalse']")
    tf.find("answer/text").text = "yes"
    assert any("truefalse" in p for p in validate_export("moodle-xml", etree.tostring(root)))


def test_not_a_zip_fails(schemas_dir: Path) -> None:
    assert validate_export("qti21", b"PK nonsense", schemas_dir) == ["qti21: not a zip file"]
