"""QTI 2.1 content package (exports.md §2): a manifest, assessment tests and ``items/*.xml``.

A student meets each question once: every ``assessmentTest`` holds each item exactly once, in
one language. QTI has no alternate-language construct and players do not switch on ``xml:lang``
(§5), and bilingual spans inside one item would show both languages at once, so ``--lang all``
writes one complete test per language in the one package. An LMS imports each test as its own
quiz (one per language); none of them asks a question twice, so no score doubles.

Layout, which ``kgrade``'s QTI 2.1 importer reads back (Q: the quiz id, I: an item id, L: a
language code from ``item_bank.model.LANGUAGES``):

==================  =============================  =============================================
                    ``--lang en`` / ``source``     ``--lang all`` (languages: source, en, then
                                                   any language the whole quiz is translated to)
==================  =============================  =============================================
test file           ``test.xml``                   ``test-L.xml`` per language
test identifier     ``Q``                          ``Q-L``
test resource       ``Q-test``                     ``Q-test-L``
item file           ``items/I.xml``                ``items/I-L.xml``
item identifier     ``I``                          ``I-L``
item resource       ``res-I``                      ``res-I-L``
==================  =============================  =============================================

- Manifest (``imsmanifest.xml``, IMS CP 1.1): for each language in turn, the test resource
  (``type="imsqti_test_xmlv2p1"``), whose ``<dependency identifierref>`` list is exactly its own
  items in quiz order, then those item resources (``type="imsqti_item_xmlv2p1"``). Every
  resource's ``href`` equals its one ``<file href>``.
- Test: one ``testPart`` (``part1``) with one ``assessmentSection`` (``section-L``) holding one
  ``assessmentItemRef`` per item (``identifier`` the item identifier, ``href`` its file). The
  test's ``SCORE`` and ``MAXSCORE`` are the sums of its own items' (so, once per question).
  ``assessmentTest`` takes no ``xml:lang``; its title is the quiz title in that language, with
  the language's English name in brackets under ``--lang all``.
- Item: ``assessmentItem xml:lang="L"``, ``title`` the bank's item id ``I``; each string carries
  ``xml:lang`` of the language it is actually written in (a seed string keeps its own).
  Choices are ``RESPONSE_<n>`` with ``n`` from ``_common.answer_idents`` (stable per option id).
- Shuffling: ``choiceInteraction shuffle`` per item (``_common.shuffles``: the quiz shuffles and
  the item does not keep its written order).
"""

from __future__ import annotations

from dataclasses import dataclass

from lxml import etree

from item_bank.model import LANGUAGES, Item, Quiz, Text
from service.exports._common import (
    XML_LANG,
    answer_idents,
    format_points,
    shuffles,
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
        shuffle="true" if shuffles(quiz, item) else "false",
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


def assessment_href(d: Delivery) -> str:
    return f"test{d.suffix}.xml"


def assessment_id(quiz: Quiz, d: Delivery) -> str:
    return f"{quiz.id}{d.suffix}"


def _sum_of_items(parent: etree._Element, outcome: str) -> None:
    """``outcome`` := the sum of every item's ``outcome`` in this test."""
    so = sub(parent, q("setOutcomeValue"), identifier=outcome)
    sub(sub(so, q("sum")), q("testVariables"), variableIdentifier=outcome)


def build_test(quiz: Quiz, d: Delivery, several: bool) -> etree._Element:
    """One language's test: each item once. ``several``: the package holds one per language."""
    title = d.text(quiz.title, quiz.source_lang)[1]
    if several:
        title = f"{title} ({LANGUAGES[d.lang]})"
    # assessmentTest and assessmentSection take no xml:lang; their titles are plain text.
    root = etree.Element(
        q("assessmentTest"), nsmap={None: QTI_NS}, identifier=assessment_id(quiz, d), title=title
    )
    for outcome in ("SCORE", "MAXSCORE"):
        sub(
            root,
            q("outcomeDeclaration"),
            identifier=outcome,
            cardinality="single",
            baseType="float",
        )
    part = sub(
        root,
        q("testPart"),
        identifier="part1",
        navigationMode="nonlinear",
        submissionMode="simultaneous",
    )
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
    op = sub(root, q("outcomeProcessing"))
    _sum_of_items(op, "SCORE")
    _sum_of_items(op, "MAXSCORE")
    return root


def _manifest(quiz: Quiz, ds: list[Delivery]) -> etree._Element:
    root = etree.Element(c("manifest"), nsmap={None: CP_NS}, identifier=f"{quiz.id}-manifest")
    md = sub(root, c("metadata"))
    # 'QTIv2.1 Package' is also what Canvas matches (/QTIv2\./) to take the QTI 2 path.
    sub(md, c("schema"), "QTIv2.1 Package")
    sub(md, c("schemaversion"), "1.0.0")
    sub(root, c("organizations"))
    res = sub(root, c("resources"))
    for d in ds:
        href = assessment_href(d)
        test = sub(
            res,
            c("resource"),
            identifier=f"{quiz.id}-test{d.suffix}",
            type="imsqti_test_xmlv2p1",
            href=href,
        )
        sub(test, c("file"), href=href)
        for item in quiz.items:
            sub(test, c("dependency"), identifierref=f"res-{item.id}{d.suffix}")
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
    files = [("imsmanifest.xml", xml_bytes(_manifest(quiz, ds)))]
    for d in ds:
        files.append((assessment_href(d), xml_bytes(build_test(quiz, d, several=len(ds) > 1))))
        for item in quiz.items:
            files.append((item_href(item, d), xml_bytes(build_item(quiz, item, d))))
    return zip_bytes(files)
