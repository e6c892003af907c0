"""Checks an export against the official schemas (exports.md §6), as library code.

``validate_export`` returns a list of one-line problems (empty: the package is valid). Every XML
file in a package is checked with its XSD, DTD or Schematron, and every ``<file href>`` in a
manifest must exist in the zip. Moodle XML has no schema, so its structure is checked instead.
Compiled schemas are cached per schemas folder: loading the QTI 2.1 XSD alone takes a second.
"""

from __future__ import annotations

import copy
import io
import os
import re
import zipfile
from functools import cached_property, lru_cache
from pathlib import Path

from lxml import etree, isoschematron

from service.exports.mbz.check import mbz_problems
from service.exports.moodle_xml import ALLOWED_FRACTIONS

SCH_NS = "http://purl.oclc.org/dsdl/schematron"
SVRL_NS = "http://purl.oclc.org/dsdl/svrl"
QTI12_NS = "http://www.imsglobal.org/xsd/ims_qtiasiv1p2"
QTI21_NS = "http://www.imsglobal.org/xsd/imsqti_v2p1"
CP_NS = "http://www.imsglobal.org/xsd/imscp_v1p1"
CC_NS = "http://www.imsglobal.org/xsd/imsccv1p1/imscp_v1p1"
CANVAS_NS = "http://canvas.instructure.com/xsd/cccv1p0"
XML_NS = "http://www.w3.org/XML/1998/namespace"
CC_DETECT = b'xmlns="http://www.imsglobal.org/xsd/imsccv1p1/imscp_v1p1"'

#: Never fetch anything while validating: every schema import resolves to a local file.
PARSER = etree.XMLParser(no_network=True, resolve_entities=False)

#: Canvas classifies feedback ids by substring (§1), so an ident must not contain these.
CANVAS_RESERVED = ("correct", "wrong", "incorrect", "general_")
CANVAS_FEEDBACK = ("general_fb", "correct_fb", "general_incorrect_fb")

MULTILANG_TAG = re.compile(r'<span lang="[a-zA-Z0-9_-]+" class="multilang">')


def default_schemas_dir() -> Path:
    """``$KGRADE_SCHEMAS``, else ``<repo>/../shared/schemas``."""
    env = os.environ.get("KGRADE_SCHEMAS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "schemas"


class Schemas:
    """The compiled validators of one schemas folder, each built on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _xsd(self, rel: str) -> etree.XMLSchema:
        return etree.XMLSchema(etree.parse(str(self.root / rel), PARSER))

    @cached_property
    def qti21(self) -> etree.XMLSchema:
        return self._xsd("qti21/qtiv2p1/imsqti_v2p1.xsd")

    @cached_property
    def imscp(self) -> etree.XMLSchema:
        return self._xsd("qti21/imscp_v1p1.xsd")

    @cached_property
    def cc_manifest(self) -> etree.XMLSchema:
        return self._xsd("cc11/ccv1p1_imscp_v1p2_v1p0.xsd")

    @cached_property
    def cc_qti(self) -> etree.XMLSchema:
        return self._xsd("cc11/ccv1p1_qtiasiv1p2p1_v1p0.xsd")

    @cached_property
    def canvas_meta(self) -> etree.XMLSchema:
        return self._xsd("canvas/cccv1p0.xsd")

    @cached_property
    def qti12_dtd(self) -> etree.DTD:
        return etree.DTD(str(self.root / "qti12/ims_qtiasiv1p2p1.dtd"))

    @cached_property
    def cc_schematron(self) -> isoschematron.Schematron:
        """The ISO-Schematron rules embedded in the CC QTI XSD's appinfo, as one schema."""
        src = etree.parse(str(self.root / "cc11/ccv1p1_qtiasiv1p2p1_v1p0.xsd"), PARSER)
        root = etree.Element(f"{{{SCH_NS}}}schema", nsmap={"sch": SCH_NS})
        for el in src.iter(f"{{{SCH_NS}}}ns", f"{{{SCH_NS}}}pattern"):
            el = copy.deepcopy(el)
            if "name" in el.attrib:  # pre-ISO attribute; lxml's ISO implementation wants @id
                el.set("id", el.attrib.pop("name").replace(" ", "_"))
            root.append(el)
        return isoschematron.Schematron(root, store_report=True)


@lru_cache(maxsize=4)
def load_schemas(root: str) -> Schemas:
    path = Path(root)
    if not (path / "qti21").is_dir():
        raise FileNotFoundError(f"no schemas at {path} (set KGRADE_SCHEMAS)")
    return Schemas(path)


# --- generic checks ---------------------------------------------------------------------------


def _log(name: str, validator: etree._Validator) -> list[str]:
    return [f"{name}:{e.line}: {e.message}" for e in validator.error_log.filter_from_errors()] or [
        f"{name}: invalid"
    ]


def check_xsd(name: str, schema: etree.XMLSchema, doc: etree._ElementTree) -> list[str]:
    return [] if schema.validate(doc) else _log(name, schema)


def strip_qti12_namespace(doc: etree._ElementTree) -> etree._ElementTree:
    """A copy without the QTI namespace and xsi:*, since the DTD knows neither (§6)."""
    doc = copy.deepcopy(doc)
    for el in doc.iter(etree.Element):
        el.tag = etree.QName(el).localname
        for a in [a for a in el.attrib if "XMLSchema-instance" in a]:
            del el.attrib[a]
    etree.cleanup_namespaces(doc)
    return doc


def check_qti12_dtd(name: str, schemas: Schemas, doc: etree._ElementTree) -> list[str]:
    dtd = schemas.qti12_dtd
    return [] if dtd.validate(strip_qti12_namespace(doc)) else _log(name, dtd)


def check_schematron(
    name: str, sch: isoschematron.Schematron, doc: etree._ElementTree, ignore: tuple[str, ...] = ()
) -> list[str]:
    """Failed assertions, minus rules listed in ``ignore`` (e.g. '[RULE 2a]')."""
    if sch.validate(doc):
        return []
    out = []
    for f in sch.validation_report.iter(f"{{{SVRL_NS}}}failed-assert"):
        msg = " ".join("".join(f.itertext()).split())
        if not any(msg.startswith(rule) for rule in ignore):
            out.append(f"{name}: {msg}")
    return out


class Package:
    """A zip held in memory, with its XML files parsed on demand."""

    def __init__(self, data: bytes) -> None:
        self.zip = zipfile.ZipFile(io.BytesIO(data))
        self.names = set(self.zip.namelist())

    def xml(self, name: str) -> etree._ElementTree:
        return etree.parse(io.BytesIO(self.zip.read(name)), PARSER)


def _manifest_files(manifest: etree._ElementTree, pkg: Package, ns: str) -> list[str]:
    problems = []
    for f in manifest.iter(f"{{{ns}}}file"):
        href = f.get("href", "")
        if href not in pkg.names:
            problems.append(f"imsmanifest.xml: <file href={href!r}> is not in the package")
    return problems


def _resources(manifest: etree._ElementTree, ns: str, rtype: str) -> list[etree._Element]:
    return [r for r in manifest.iter(f"{{{ns}}}resource") if r.get("type") == rtype]


def _first_file(resource: etree._Element, ns: str) -> str | None:
    f = resource.find(f"{{{ns}}}file")
    return None if f is None else f.get("href")


# --- Canvas QTI 1.2 ---------------------------------------------------------------------------


def _qti12_q(tag: str) -> str:
    return f"{{{QTI12_NS}}}{tag}"


def _row_kind(rc: etree._Element) -> int:
    """Which of Canvas's resprocessing rows (§1) a respcondition is: 1, 2, 3 or 4."""
    refs = [d.get("linkrefid") for d in rc.iter(_qti12_q("displayfeedback"))]
    if rc.find(_qti12_q("setvar")) is not None:
        return 3
    if "general_fb" in refs:
        return 1
    if "general_incorrect_fb" in refs:
        return 4
    return 2


def canvas_item_problems(name: str, doc: etree._ElementTree) -> list[str]:
    """Canvas's own rules: integer answer idents, reserved words, the row order."""
    problems = []
    for item in doc.iter(_qti12_q("item")):
        where = f"{name}: item {item.get('ident')}"
        idents = [lbl.get("ident", "") for lbl in item.iter(_qti12_q("response_label"))]
        if len(set(idents)) != len(idents):
            problems.append(f"{where}: duplicate answer idents")
        for ident in idents:
            if not ident.isdigit() or int(ident) < 1:
                problems.append(f"{where}: answer ident {ident!r} is not a positive integer")
        for fb in item.iter(_qti12_q("itemfeedback")):
            fid = fb.get("ident", "")
            if fid in CANVAS_FEEDBACK:
                continue
            base = fid.removesuffix("_fb")
            if base not in idents or any(w in fid for w in CANVAS_RESERVED):
                problems.append(f"{where}: feedback ident {fid!r} is not '<answer ident>_fb'")
        rp = item.find(_qti12_q("resprocessing"))
        if rp is None:
            problems.append(f"{where}: no resprocessing")
            continue
        kinds = [_row_kind(rc) for rc in rp.iter(_qti12_q("respcondition"))]
        if kinds != sorted(kinds) or kinds.count(3) != 1:
            problems.append(f"{where}: resprocessing rows {kinds} are not in Canvas's order")
        linked = {d.get("linkrefid") for d in rp.iter(_qti12_q("displayfeedback"))}
        defined = {fb.get("ident") for fb in item.iter(_qti12_q("itemfeedback"))}
        if linked != defined:
            problems.append(
                f"{where}: displayfeedback {sorted(linked - defined)} / "
                f"itemfeedback {sorted(defined - linked)} do not match"
            )
    return problems


def _validate_qti12(pkg: Package, s: Schemas) -> list[str]:
    manifest = pkg.xml("imsmanifest.xml")
    problems = _manifest_files(manifest, pkg, CC_NS)
    # No CC schema fits Canvas's manifest; retagged into plain IMS CP it must pass CP 1.1 (§6).
    retagged = copy.deepcopy(manifest)
    for el in retagged.iter(etree.Element):
        if etree.QName(el).namespace == CC_NS:
            el.tag = f"{{{CP_NS}}}{etree.QName(el).localname}"
    etree.cleanup_namespaces(retagged)
    problems += check_xsd("imsmanifest.xml", s.imscp, retagged)

    quizzes = _resources(manifest, CC_NS, "imsqti_xmlv1p2")
    if len(quizzes) != 1:
        return [*problems, f"imsmanifest.xml: {len(quizzes)} imsqti_xmlv1p2 resources, expected 1"]
    qti_name = _first_file(quizzes[0], CC_NS)
    if qti_name not in pkg.names:
        return problems
    doc = pkg.xml(qti_name)
    problems += check_qti12_dtd(qti_name, s, doc)
    problems += check_xsd(qti_name, s.cc_qti, doc)  # MC/TF/MR items fit the CC profile too
    problems += canvas_item_problems(qti_name, doc)

    ident = doc.getroot().find(_qti12_q("assessment")).get("ident", "")
    if quizzes[0].get("identifier") != ident or qti_name != f"{ident}/{ident}.xml":
        problems.append(f"{qti_name}: assessment ident {ident!r} must name its folder and resource")
    meta_name = f"{ident}/assessment_meta.xml"
    metas = [
        r
        for r in manifest.iter(f"{{{CC_NS}}}resource")
        if r.get("type", "").endswith("learning-application-resource")
    ]
    if not any(_first_file(r, CC_NS) == meta_name for r in metas):
        problems.append(f"imsmanifest.xml: no learning-application-resource for {meta_name}")
    if meta_name in pkg.names:
        meta = pkg.xml(meta_name)
        problems += check_xsd(meta_name, s.canvas_meta, meta)
        if meta.getroot().get("identifier") != ident:
            problems.append(f"{meta_name}: quiz identifier is not {ident!r}")
    return problems


# --- Common Cartridge -------------------------------------------------------------------------


def cc_layout_problems(name: str, doc: etree._ElementTree) -> list[str]:
    """Moodle folds every continue="Yes" row into the general feedback (§3): only general_fb."""
    problems = []
    for rc in doc.iter(_qti12_q("respcondition")):
        if rc.get("continue") == "Yes":
            refs = [d.get("linkrefid") for d in rc.iter(_qti12_q("displayfeedback"))]
            if refs != ["general_fb"]:
                item = next(rc.iterancestors(_qti12_q("item"))).get("ident")
                problems.append(f'{name}: item {item}: continue="Yes" row shows {refs}')
    return problems


def _validate_imscc(pkg: Package, s: Schemas) -> list[str]:
    problems = []
    if CC_DETECT not in pkg.zip.read("imsmanifest.xml")[:1024]:
        problems.append("imsmanifest.xml: no default CC 1.1 namespace in the first 1024 bytes")
    manifest = pkg.xml("imsmanifest.xml")
    problems += _manifest_files(manifest, pkg, CC_NS)
    problems += check_xsd("imsmanifest.xml", s.cc_manifest, manifest)
    quizzes = _resources(manifest, CC_NS, "imsqti_xmlv1p2/imscc_xmlv1p1/assessment")
    if not quizzes:
        problems.append("imsmanifest.xml: no imsqti_xmlv1p2/imscc_xmlv1p1/assessment resource")
    refs = {i.get("identifierref") for i in manifest.iter(f"{{{CC_NS}}}item")}
    for res in quizzes:
        if res.get("identifier") not in refs:
            problems.append(
                f"imsmanifest.xml: no organization item references {res.get('identifier')}"
            )
        name = _first_file(res, CC_NS)
        if name not in pkg.names:
            continue
        doc = pkg.xml(name)
        problems += check_xsd(name, s.cc_qti, doc)
        problems += check_schematron(name, s.cc_schematron, doc)
        problems += check_qti12_dtd(name, s, doc)
        problems += cc_layout_problems(name, doc)
    return problems


# --- QTI 2.1 ----------------------------------------------------------------------------------


def _qti21_test_problems(
    pkg: Package, test: etree._Element, items: dict[str, etree._Element]
) -> list[str]:
    """One test: its dependencies are the items it references, each asked once, in one language.

    Two language versions of a question in one test would make a student answer it twice and
    count its points twice (issue 17 §3), so a test whose items differ in ``xml:lang`` fails.
    """
    name = test.get("href", "")
    problems: list[str] = []
    deps = [d.get("identifierref", "") for d in test.iter(f"{{{CP_NS}}}dependency")]
    unknown = [d for d in deps if d not in items]
    if unknown:
        problems.append(f"imsmanifest.xml: test {name}: dependencies {unknown} are not items")
    dep_hrefs = {items[d].get("href") for d in deps if d in items}
    refs = [r.get("href", "") for r in pkg.xml(name).iter(f"{{{QTI21_NS}}}assessmentItemRef")]
    for href in refs:
        if href not in pkg.names:
            problems.append(f"{name}: assessmentItemRef {href!r} is not in the package")
    if set(refs) != dep_hrefs:
        problems.append(f"imsmanifest.xml: test {name}: its dependencies are not its item refs")
    twice = sorted({h for h in refs if refs.count(h) > 1})
    if twice:
        problems.append(f"{name}: items {twice} are asked more than once")
    langs: dict[str, list[str]] = {}
    for href in dict.fromkeys(refs):
        if href in pkg.names:
            lang = pkg.xml(href).getroot().get(f"{{{XML_NS}}}lang", "")
            langs.setdefault(lang, []).append(href)
    if len(langs) > 1:
        mix = ", ".join(f"{lang or '?'}: {len(hs)}" for lang, hs in sorted(langs.items()))
        problems.append(f"{name}: items in several languages ({mix}); one test per language")
    return problems


def _validate_qti21(pkg: Package, s: Schemas) -> list[str]:
    manifest = pkg.xml("imsmanifest.xml")
    problems = _manifest_files(manifest, pkg, CP_NS)
    problems += check_xsd("imsmanifest.xml", s.imscp, manifest)
    tests = _resources(manifest, CP_NS, "imsqti_test_xmlv2p1")
    items = _resources(manifest, CP_NS, "imsqti_item_xmlv2p1")
    if not tests:
        problems.append("imsmanifest.xml: no imsqti_test_xmlv2p1 resource")
    for res in tests + items:
        if res.get("href") != _first_file(res, CP_NS):
            problems.append(f"imsmanifest.xml: resource {res.get('identifier')}: href != file href")
    for res in tests + items:
        name = res.get("href", "")
        if name in pkg.names:
            problems += check_xsd(name, s.qti21, pkg.xml(name))
    by_id = {r.get("identifier", ""): r for r in items}
    used: set[str] = set()
    for res in tests:
        used.update(d.get("identifierref", "") for d in res.iter(f"{{{CP_NS}}}dependency"))
        if res.get("href", "") in pkg.names:
            problems += _qti21_test_problems(pkg, res, by_id)
    unused = sorted(set(by_id) - used)
    if unused:
        problems.append(f"imsmanifest.xml: items {unused} belong to no test")
    return problems


# --- Moodle XML -------------------------------------------------------------------------------


def multilang_problems(html: str) -> list[str]:
    """Moodle's core multilang filter rules (§4) for one HTML text.

    Spans must be written exactly ``<span lang="xx" class="multilang">`` (double quotes), hold no
    nested span, and come in groups of two or more with only whitespace between them.
    """
    problems = []
    starts = [m.start() for m in re.finditer(r"<span\b[^>]*\bmultilang\b[^>]*>", html)]
    if not starts:
        return []
    spans: list[tuple[int, int]] = []
    for pos in starts:
        tag = MULTILANG_TAG.match(html, pos)
        if tag is None:
            problems.append(
                f'multilang span not written as <span lang="xx" class="multilang">: '
                f"{html[pos : pos + 60]!r}"
            )
            continue
        close = html.find("</span>", tag.end())
        if close < 0:
            problems.append("multilang span is not closed")
            continue
        if "<span" in html[tag.end() : close]:
            problems.append("multilang span contains a nested span")
        spans.append((pos, close + len("</span>")))
    for i, (start, end) in enumerate(spans):
        before = i > 0 and html[spans[i - 1][1] : start].strip() == ""
        after = i + 1 < len(spans) and html[end : spans[i + 1][0]].strip() == ""
        if not (before or after):
            problems.append(
                f"lone multilang span (needs an adjacent one): {html[start:end][:60]!r}"
            )
    return problems


def mlang_problems(html: str) -> list[str]:
    """filter_multilang2: balanced ``{mlang xx}…{mlang}`` blocks, with an ``other`` fallback."""
    tokens = re.findall(r"\{mlang(?: ([a-zA-Z0-9_,-]+))?\}", html)
    if not tokens:
        return []
    problems = []
    opens = tokens[0::2]
    closes = tokens[1::2]
    if len(tokens) % 2 or any(not t for t in opens) or any(t for t in closes):
        problems.append(f"unbalanced {{mlang}} blocks: {html[:80]!r}")
    if "other" not in opens:
        problems.append(f"{{mlang}} text without an {{mlang other}} fallback: {html[:80]!r}")
    return problems


def _fraction_ok(value: str) -> bool:
    try:
        f = float(value) / 100
    except ValueError:
        return False
    return f == 0 or any(abs(abs(f) - float(a) / 100) < 1e-5 for a in ALLOWED_FRACTIONS)


def _moodle_question_problems(qn: etree._Element, where: str) -> list[str]:
    problems = []
    if not (qn.findtext("name/text") or "").strip():
        problems.append(f"{where}: no <name><text>")
    if not (qn.findtext("questiontext/text") or "").strip():
        problems.append(f"{where}: no question text")
    if qn.find("generalfeedback/text") is None:
        problems.append(f"{where}: no <generalfeedback>")
    answers = qn.findall("answer")
    fractions = [a.get("fraction", "") for a in answers]
    for fr in fractions:
        if not _fraction_ok(fr):
            problems.append(f"{where}: fraction {fr!r} is not one Moodle accepts")
    if problems:
        return problems
    values = [float(f) for f in fractions]
    if qn.get("type") == "truefalse":
        texts = sorted((a.findtext("text") or "") for a in answers)
        if texts != ["false", "true"] or sorted(values) != [0, 100]:
            problems.append(f"{where}: a truefalse needs answers 'true'/'false' graded 100/0")
        return problems
    single = qn.findtext("single")
    if single not in ("true", "false"):
        return [f"{where}: <single> must be true or false"]
    if len(answers) < 2:
        problems.append(f"{where}: fewer than two answers")
    if single == "true" and max(values) != 100:
        problems.append(f"{where}: no answer is graded 100")
    if single == "false" and round(sum(v for v in values if v > 0), 2) != 100:
        problems.append(f"{where}: positive fractions do not add up to 100")
    return problems


def _validate_moodle(data: bytes) -> list[str]:
    try:
        root = etree.parse(io.BytesIO(data), PARSER).getroot()
    except etree.XMLSyntaxError as exc:
        return [f"moodle xml: not well-formed: {exc}"]
    if root.tag != "quiz":
        return [f"moodle xml: root is <{root.tag}>, expected <quiz>"]
    problems = []
    questions = root.findall("question")
    cats = [qn for qn in questions if qn.get("type") == "category"]
    if not cats or not (cats[0].findtext("category/text") or "").startswith("$course$/"):
        problems.append("moodle xml: no $course$ category before the questions")
    real = [qn for qn in questions if qn.get("type") != "category"]
    if not real:
        problems.append("moodle xml: no questions")
    for i, qn in enumerate(real, 1):
        where = f"question {i} ({qn.findtext('name/text')})"
        if qn.get("type") not in ("multichoice", "truefalse"):
            problems.append(f"{where}: unexpected type {qn.get('type')!r}")
            continue
        problems += _moodle_question_problems(qn, where)
    for el in root.iter():
        if el.get("format") == "html":
            html = el.findtext("text") or ""
            problems += [f"moodle xml: <{el.tag}>: {p}" for p in multilang_problems(html)]
            problems += [f"moodle xml: <{el.tag}>: {p}" for p in mlang_problems(html)]
    return problems


# --- entry point ------------------------------------------------------------------------------

_PACKAGED = {"qti12": _validate_qti12, "qti21": _validate_qti21, "imscc": _validate_imscc}


def validate_export(fmt: str, data: bytes, schemas_dir: str | Path | None = None) -> list[str]:
    """Problems found in an export of format ``fmt`` (empty list: valid)."""
    if fmt == "moodle-xml":
        return _validate_moodle(data)
    if fmt == "moodle-mbz":  # a Moodle backup has no schema: its structure and marks
        return mbz_problems(data)
    if fmt not in _PACKAGED:
        raise ValueError(f"unknown export format {fmt!r}")
    schemas = load_schemas(str(Path(schemas_dir) if schemas_dir else default_schemas_dir()))
    try:
        pkg = Package(data)
    except zipfile.BadZipFile:
        return [f"{fmt}: not a zip file"]
    if "imsmanifest.xml" not in pkg.names:
        return [f"{fmt}: no imsmanifest.xml at the top of the package"]
    try:
        return _PACKAGED[fmt](pkg, schemas)
    except etree.XMLSyntaxError as exc:
        return [f"{fmt}: not well-formed XML: {exc}"]
