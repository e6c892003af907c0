"""QTI 2.1 content package (exports.md §2): manifest, ``test.xml`` and ``items/*.xml``.

QTI has no alternate-language construct, so ``--lang all`` writes one item per language
(``q1-sn``, ``q1-en``), grouped into one section per language.
"""

from __future__ import annotations

from dataclasses import dataclass

from lxml import etree

from item_bank.model import LANGUAGES, Item, Quiz, Text
from service.exports._common import (
    XML_LANG,
    answer_idents,
    format_points,
    plain,
    sub,
    xml_bytes,
    zip_bytes,
)

QTI_NS = "http://www.imsglobal.org/xsd/imsqti_v2p1"
CP_NS = "http://www.imsglobal.org/xsd/imscp_v1p1"


def q(tag: str) -> str:
    return f"{{{QTI_NS}}}{tag}"


def c(tag: str) -> str:
    return f"{{{CP_NS}}}{tag}"


@dataclass(frozen=True)
class Delivery:
    """One language version of the quiz: ``lang`` tags the items, ``render`` picks strings."""

    lang: str
    suffix: str  # '' for a single-language export, else '-<lang>'

    def text(self, t: Text, source_lang: str) -> tuple[str, str]:
        """(actual language, text) of ``t`` in this version; a missing translation falls back
        to the string's source form, tagged with *its* language."""
        if self.lang == "en":
            return t.render("en", source_lang)
        if self.lang == source_lang:
            return t.render("source", source_lang)
        value = t.get(self.lang)
        return (self.lang, value) if value is not None else t.render("source", source_lang)


def deliveries(quiz: Quiz, mode: str) -> list[Delivery]:
    src = quiz.source_lang
    if mode == "en":
        return [Delivery("en", "")]
    if mode == "source":
        return [Delivery(src, "")]
    langs = [src, "en"]
    # A third language gets its own items only where the whole quiz is translated into it;
    # otherwise its "version" would be the source version with a stray string or two.
    texts = list(quiz.texts())
    langs += [
        lang
        for lang in sorted(LANGUAGES)
        if lang not in langs and all(t.get(lang) is not None for t in texts)
    ]
    return [Delivery(lang, f"-{lang}") for lang in dict.fromkeys(langs)]


def choice_id(n: int) -> str:
    # Canvas's converter turns answer 1001 into RESPONSE_1001 and its feedback into
    # FEEDBACK_1001_fb; using its names lets Canvas map feedback back to answers (§2).
    return f"RESPONSE_{n}"


def _text(parent: etree._Element, tag: str, lt: tuple[str, str], **attrib: str) -> etree._Element:
    el = sub(parent, tag, lt[1], **attrib)
    el.set(XML_LANG, lt[0])
    return el


def _add_feedback_id(parent: etree._Element, ident: str) -> None:
    """FEEDBACK := FEEDBACK ∪ {ident} (``multiple`` ignores the initial NULL)."""
    so = sub(parent, q("setOutcomeValue"), identifier="FEEDBACK")
    mult = sub(so, q("multiple"))
    sub(mult, q("variable"), identifier="FEEDBACK")
    sub(mult, q("baseValue"), ident, baseType="identifier")


def build_item(quiz: Quiz, item: Item, d: Delivery) -> etree._Element:
    src = quiz.source_lang
    ids = {oid: choice_id(n) for oid, n in answer_idents(quiz, item).items()}
    multiple = item.type == "multiple_answers"
    root = etree.Element(
        q("assessmentItem"),
        nsmap={None: QTI_NS},
        identifier=f"{item.id}{d.suffix}",
        title=item.id,
        adaptive="false",
        timeDependent="false",
    )
    root.set(XML_LANG, d.lang)

    rd = sub(
        root,
        q("responseDeclaration"),
        identifier="RESPONSE",
        cardinality="multiple" if multiple else "single",
        baseType="identifier",
    )
    cr = sub(rd, q("correctResponse"))
    for o in item.options:
        if o.correct:
            sub(cr, q("value"), ids[o.id])
    score = sub(
        root, q("outcomeDeclaration"), identifier="SCORE", cardinality="single", baseType="float"
    )
    sub(sub(score, q("defaultValue")), q("value"), "0")
    maxscore = sub(
        root, q("outcomeDeclaration"), identifier="MAXSCORE", cardinality="single", baseType="float"
    )
    sub(sub(maxscore, q("defaultValue")), q("value"), format_points(item.points))
    sub(
        root,
        q("outcomeDeclaration"),
        identifier="FEEDBACK",
        cardinality="multiple",
        baseType="identifier",
    )

    body = sub(root, q("itemBody"))
    ci = sub(
        body,
        q("choiceInteraction"),
        responseIdentifier="RESPONSE",
        shuffle="true" if quiz.settings.shuffle_answers else "false",
        maxChoices="0" if multiple else "1",
    )
    _text(ci, q("prompt"), d.text(item.prompt, src))
    for o in item.options:
        _text(ci, q("simpleChoice"), d.text(o.text, src), identifier=ids[o.id])

    # Feedback, named as Canvas's converter names it: the explanation always (general_fb), the
    # single correct answer's comment as correct_fb, every other comment per answer.
    feedback: list[tuple[str, tuple[str, str]]] = [("general_fb", d.text(item.explanation, src))]
    per_choice: list[tuple[str, str]] = []  # (choice id, feedback id)
    correct_fb = False
    for o in item.options:
        if o.feedback is None:
            continue
        if o.correct and not multiple:
            feedback.append(("correct_fb", d.text(o.feedback, src)))
            correct_fb = True
        else:
            fid = f"FEEDBACK_{ids[o.id].removeprefix('RESPONSE_')}_fb"
            feedback.append((fid, d.text(o.feedback, src)))
            per_choice.append((ids[o.id], fid))

    rp = sub(root, q("responseProcessing"))
    _add_feedback_id(rp, "general_fb")
    cond = sub(sub(rp, q("responseCondition")), q("responseIf"))
    match = sub(cond, q("match"))
    sub(match, q("variable"), identifier="RESPONSE")
    sub(match, q("correct"), identifier="RESPONSE")
    so = sub(cond, q("setOutcomeValue"), identifier="SCORE")
    sub(so, q("variable"), identifier="MAXSCORE")
    if correct_fb:
        _add_feedback_id(cond, "correct_fb")
    for cid, fid in per_choice:
        rif = sub(sub(rp, q("responseCondition")), q("responseIf"))
        if multiple:
            test = sub(rif, q("member"))
            sub(test, q("baseValue"), cid, baseType="identifier")
            sub(test, q("variable"), identifier="RESPONSE")
        else:
            test = sub(rif, q("match"))
            sub(test, q("variable"), identifier="RESPONSE")
            sub(test, q("baseValue"), cid, baseType="identifier")
        _add_feedback_id(rif, fid)

    for fid, lt in feedback:
        # modalFeedback may not carry xml:lang (XSD), so the language goes on an inner <p>.
        mf = sub(
            root, q("modalFeedback"), outcomeIdentifier="FEEDBACK", showHide="show", identifier=fid
        )
        _text(mf, q("p"), lt)
    return root


def item_href(item: Item, d: Delivery) -> str:
    return f"items/{item.id}{d.suffix}.xml"


def build_test(quiz: Quiz, mode: str, ds: list[Delivery]) -> etree._Element:
    # assessmentTest and assessmentSection take no xml:lang; their titles are plain text.
    root = etree.Element(
        q("assessmentTest"),
        nsmap={None: QTI_NS},
        identifier=quiz.id,
        title=plain(quiz.title, mode, quiz.source_lang),
    )
    part = sub(
        root,
        q("testPart"),
        identifier="part1",
        navigationMode="nonlinear",
        submissionMode="simultaneous",
    )
    for d in ds:
        section = sub(
            part,
            q("assessmentSection"),
            identifier=f"section-{d.lang}",
            title=LANGUAGES[d.lang],
            visible="true",
        )
        for item in quiz.items:
            sub(
                section,
                q("assessmentItemRef"),
                identifier=f"{item.id}{d.suffix}",
                href=item_href(item, d),
            )
    return root


def _manifest(quiz: Quiz, ds: list[Delivery]) -> etree._Element:
    root = etree.Element(c("manifest"), nsmap={None: CP_NS}, identifier=f"{quiz.id}-manifest")
    md = sub(root, c("metadata"))
    # 'QTIv2.1 Package' is also what Canvas matches (/QTIv2\./) to take the QTI 2 path.
    sub(md, c("schema"), "QTIv2.1 Package")
    sub(md, c("schemaversion"), "1.0.0")
    sub(root, c("organizations"))
    res = sub(root, c("resources"))
    test = sub(
        res,
        c("resource"),
        identifier=f"{quiz.id}-test",
        type="imsqti_test_xmlv2p1",
        href="test.xml",
    )
    sub(test, c("file"), href="test.xml")
    for d in ds:
        for item in quiz.items:
            sub(test, c("dependency"), identifierref=f"res-{item.id}{d.suffix}")
    for d in ds:
        for item in quiz.items:
            href = item_href(item, d)
            r = sub(
                res,
                c("resource"),
                identifier=f"res-{item.id}{d.suffix}",
                type="imsqti_item_xmlv2p1",
                href=href,
            )
            sub(r, c("file"), href=href)
    return root


def export(quiz: Quiz, mode: str) -> bytes:
    ds = deliveries(quiz, mode)
    files = [
        ("imsmanifest.xml", xml_bytes(_manifest(quiz, ds))),
        ("test.xml", xml_bytes(build_test(quiz, mode, ds))),
    ]
    for d in ds:
        for item in quiz.items:
            files.append((item_href(item, d), xml_bytes(build_item(quiz, item, d))))
    return zip_bytes(files)
