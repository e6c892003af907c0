"""QTI 1.2 items, in Canvas's flavour (the Canvas zip) and in the CC 1.1 profile (``imscc``).

Both importers read the same ``questestinterop`` but disagree on what the response-processing
rows mean (exports.md §1 vs §3), so the item builder takes a ``flavour`` and the row layout is
the only thing that differs.
"""

from __future__ import annotations

from typing import Literal

from lxml import etree

from item_bank.model import Item, Quiz
from service.exports._common import (
    HtmlStyle,
    answer_idents,
    format_points,
    html_block,
    html_inline,
    pieces,
    plain,
    shuffles,
    sub,
    true_false_value,
    xml_bytes,
    zip_bytes,
)

QTI_NS = "http://www.imsglobal.org/xsd/ims_qtiasiv1p2"
CP_CC_NS = "http://www.imsglobal.org/xsd/imsccv1p1/imscp_v1p1"
CANVAS_NS = "http://canvas.instructure.com/xsd/cccv1p0"
META_TYPE = "associatedcontent/imscc_xmlv1p1/learning-application-resource"

Flavour = Literal["canvas", "cc"]

CANVAS_TYPES = {
    "multiple_choice": "multiple_choice_question",
    "multiple_answers": "multiple_answers_question",
    "true_false": "true_false_question",
}
CC_PROFILES = {
    "multiple_choice": "cc.multiple_choice.v0p1",
    "multiple_answers": "cc.multiple_response.v0p1",
    "true_false": "cc.true_false.v0p1",
}
RESPONSE_ID = "response1"  # Canvas's own name for the single choice response


def q(tag: str) -> str:
    return f"{{{QTI_NS}}}{tag}"


def _meta_field(parent: etree._Element, label: str, entry: str) -> None:
    field = sub(parent, q("qtimetadatafield"))
    sub(field, q("fieldlabel"), label)
    sub(field, q("fieldentry"), entry)


def _mattext(parent: etree._Element, html: str) -> None:
    # The HTML goes in as text, so lxml escapes it: Canvas and Moodle both unescape mattext.
    mat = sub(parent, q("material"))
    sub(mat, q("mattext"), html, texttype="text/html")


def _feedback(item_el: etree._Element, ident: str, html: str) -> None:
    fb = sub(item_el, q("itemfeedback"), ident=ident)
    _mattext(sub(fb, q("flow_mat")), html)


def _row(
    rp: etree._Element,
    cont: str,
    feedback_ids: list[str],
    *,
    equals: str | None = None,
    score: str | None = None,
) -> etree._Element:
    """One respcondition: ``<other/>`` unless ``equals`` names an answer ident."""
    rc = sub(rp, q("respcondition"), **{"continue": cont})
    cv = sub(rc, q("conditionvar"))
    if equals is None:
        sub(cv, q("other"))
    else:
        sub(cv, q("varequal"), equals, respident=RESPONSE_ID)
    if score is not None:
        sub(rc, q("setvar"), score, action="Set", varname="SCORE")
    for fid in feedback_ids:
        sub(rc, q("displayfeedback"), feedbacktype="Response", linkrefid=fid)
    return rc


def _all_correct_condition(rc: etree._Element, idents: list[tuple[str, bool]], case: bool) -> None:
    """MR scoring: every correct answer chosen and no wrong one (Canvas's ``<and>``)."""
    cv = sub(rc, q("conditionvar"))
    both = sub(cv, q("and"))
    # Moodle's CC reader counts only varequal[@case='Yes'] in the SCORE=100 row as correct (§3).
    extra = {"case": "Yes"} if case else {}
    for ident, correct in idents:
        if correct:
            sub(both, q("varequal"), ident, respident=RESPONSE_ID, **extra)
        else:
            sub(sub(both, q("not")), q("varequal"), ident, respident=RESPONSE_ID)


def build_item(
    parent: etree._Element,
    quiz: Quiz,
    item: Item,
    mode: str,
    style: HtmlStyle,
    flavour: Flavour,
) -> etree._Element:
    src = quiz.source_lang
    ints = answer_idents(quiz, item)
    if flavour == "cc" and item.type == "true_false":
        # Moodle's CC restore throws unless a T/F item's idents are exactly 'true'/'false'.
        ids = {o.id: ("true" if true_false_value(item, o) else "false") for o in item.options}
    else:
        ids = {oid: str(n) for oid, n in ints.items()}

    item_el = sub(parent, q("item"), ident=item.id, title=item.id)
    qm = sub(sub(item_el, q("itemmetadata")), q("qtimetadata"))
    if flavour == "canvas":
        _meta_field(qm, "question_type", CANVAS_TYPES[item.type])
        _meta_field(qm, "points_possible", format_points(item.points))
        _meta_field(qm, "original_answer_ids", ",".join(ids[o.id] for o in item.options))
    else:
        _meta_field(qm, "cc_profile", CC_PROFILES[item.type])
        # cc_weighting is an integer 1..99 (Schematron 2c); Moodle makes it the default grade.
        _meta_field(qm, "cc_weighting", str(min(99, max(1, round(item.points)))))

    pres = sub(item_el, q("presentation"))
    _mattext(pres, html_block(pieces(item.prompt, mode, src), style))
    card = "Multiple" if item.type == "multiple_answers" else "Single"
    # Per item, so an item that keeps its written order says so: New Quizzes reads this flag
    # (instructure/qti: render_choice/@shuffle), the CC profile allows it, Classic reads the meta.
    rc = sub(
        sub(pres, q("response_lid"), ident=RESPONSE_ID, rcardinality=card),
        q("render_choice"),
        shuffle="Yes" if shuffles(quiz, item) else "No",
    )
    for o in item.options:
        label = sub(rc, q("response_label"), ident=ids[o.id])
        _mattext(label, html_inline(pieces(o.text, mode, src), style))

    # Which feedback goes where (ids are '<ident>_fb' as Canvas writes them).
    fb_html: dict[str, str] = {"general_fb": html_block(pieces(item.explanation, mode, src), style)}
    per_answer: list[str] = []  # answer idents whose feedback is per-answer (row #2)
    correct_fb: list[str] = []  # feedback ids shown by the scoring row (#3)
    after_score: list[str] = []  # CC only: MR correct answers' own rows, after the scoring row
    single = item.type != "multiple_answers"
    for o in item.options:
        if o.feedback is None:
            continue
        html = html_block(pieces(o.feedback, mode, src), style)
        if flavour == "canvas" and single and o.correct:
            # One correct answer: its feedback is exactly Canvas's "correct" comment.
            fb_html["correct_fb"] = html
            correct_fb.append("correct_fb")
            continue
        fb_html[f"{ids[o.id]}_fb"] = html
        if flavour == "cc" and o.correct:
            # Moodle takes an answer's feedback from rows whose first varequal is that answer;
            # a correct MC/TF answer's row is the scoring row, an MR one's comes after it.
            correct_fb.append(f"{ids[o.id]}_fb")
            if not single:
                after_score.append(ids[o.id])
        else:
            per_answer.append(ids[o.id])

    rp = sub(item_el, q("resprocessing"))
    sub(
        sub(rp, q("outcomes")),
        q("decvar"),
        maxvalue="100",
        minvalue="0",
        varname="SCORE",
        vartype="Decimal",
    )
    _row(rp, "Yes", ["general_fb"])  # 1: always shown; the only continue="Yes" row for CC
    # 2: per-answer feedback. Canvas continues to the scoring row; for CC a wrong answer's row
    # stops, since Moodle would otherwise fold its feedback into the general feedback.
    for ident in per_answer:
        _row(rp, "Yes" if flavour == "canvas" else "No", [f"{ident}_fb"], equals=ident)
    # 3: scoring.
    if single:
        (correct,) = [ids[o.id] for o in item.options if o.correct]
        _row(rp, "No", correct_fb, equals=correct, score="100")
    else:
        score_row = sub(rp, q("respcondition"), **{"continue": "No"})
        _all_correct_condition(
            score_row, [(ids[o.id], o.correct) for o in item.options], case=flavour == "cc"
        )
        sub(score_row, q("setvar"), "100", action="Set", varname="SCORE")
        for fid in correct_fb if flavour == "cc" else []:
            sub(score_row, q("displayfeedback"), feedbacktype="Response", linkrefid=fid)
    for ident in after_score:
        _row(rp, "No", [f"{ident}_fb"], equals=ident)
    # 4 (general_incorrect_fb) would follow here; the bank has no question-level "incorrect"
    # comment, and Canvas drops empty feedback, so there is no row to write.

    order = ["general_fb", "correct_fb", "general_incorrect_fb"]
    order += [f"{ids[o.id]}_fb" for o in item.options]
    for fid in order:
        if fid in fb_html:
            _feedback(item_el, fid, fb_html[fid])
    return item_el


def build_questestinterop(
    quiz: Quiz, mode: str, style: HtmlStyle, flavour: Flavour
) -> etree._Element:
    root = etree.Element(q("questestinterop"), nsmap={None: QTI_NS})
    assessment = sub(
        root, q("assessment"), ident=quiz.id, title=plain(quiz.title, mode, quiz.source_lang)
    )
    if flavour == "cc":
        qm = sub(assessment, q("qtimetadata"))
        _meta_field(qm, "cc_profile", "cc.exam.v0p1")
        _meta_field(qm, "qmd_assessmenttype", "Examination")
        _meta_field(qm, "qmd_scoretype", "Percentage")
        s = quiz.settings
        if s.time_limit_minutes is not None:
            _meta_field(qm, "qmd_timelimit", str(s.time_limit_minutes))
        # The profile only knows 1..5 and 'unlimited'; a larger limit is left out (Moodle's
        # default is then unlimited) rather than tightened behind the instructor's back.
        if s.allowed_attempts is None:
            _meta_field(qm, "cc_maxattempts", "unlimited")
        elif s.allowed_attempts <= 5:
            _meta_field(qm, "cc_maxattempts", str(s.allowed_attempts))
    section = sub(assessment, q("section"), ident="root_section")
    for item in quiz.items:
        build_item(section, quiz, item, mode, style, flavour)
    return root


def quiz_shuffles_all(quiz: Quiz) -> bool:
    """Canvas Classic's quiz-wide ``shuffle_answers``: true only if every item may shuffle."""
    return quiz.settings.shuffle_answers and all(item.shuffle for item in quiz.items)


def _assessment_meta(quiz: Quiz, mode: str) -> etree._Element:
    s = quiz.settings
    root = etree.Element(f"{{{CANVAS_NS}}}quiz", nsmap={None: CANVAS_NS}, identifier=quiz.id)

    def field(name: str, value: str) -> None:
        sub(root, f"{{{CANVAS_NS}}}{name}", value)

    src = quiz.source_lang
    field("title", plain(quiz.title, mode, src))
    field("description", html_block(pieces(quiz.description, mode, src), "tagged"))
    field("quiz_type", "assignment")
    field("scoring_policy", s.scoring_policy)
    field("points_possible", format_points(quiz.points_possible))
    if s.time_limit_minutes is not None:
        field("time_limit", str(s.time_limit_minutes))
    field("allowed_attempts", str(s.allowed_attempts if s.allowed_attempts is not None else -1))
    # Classic Quizzes shuffles per quiz only; an item that must keep its order (its options
    # refer to each other) wins over the rest, so one such item turns Classic's shuffle off.
    field("shuffle_answers", "true" if quiz_shuffles_all(quiz) else "false")
    field("show_correct_answers", "true")
    field("one_question_at_a_time", "false")
    # allow_reanswer=False means a student may not go back to an answered question.
    field("cant_go_back", "false" if s.allow_reanswer else "true")
    return root


def _manifest(quiz: Quiz) -> etree._Element:
    ns = CP_CC_NS
    root = etree.Element(f"{{{ns}}}manifest", nsmap={None: ns}, identifier=f"{quiz.id}-manifest")
    md = sub(root, f"{{{ns}}}metadata")
    sub(md, f"{{{ns}}}schema", "IMS Content")
    sub(md, f"{{{ns}}}schemaversion", "1.1.3")
    sub(root, f"{{{ns}}}organizations")
    res = sub(root, f"{{{ns}}}resources")
    r = sub(res, f"{{{ns}}}resource", identifier=quiz.id, type="imsqti_xmlv1p2")
    sub(r, f"{{{ns}}}file", href=f"{quiz.id}/{quiz.id}.xml")
    sub(r, f"{{{ns}}}dependency", identifierref=f"{quiz.id}_meta")
    meta_href = f"{quiz.id}/assessment_meta.xml"
    m = sub(res, f"{{{ns}}}resource", identifier=f"{quiz.id}_meta", type=META_TYPE, href=meta_href)
    sub(m, f"{{{ns}}}file", href=meta_href)
    return root


def export(quiz: Quiz, mode: str) -> bytes:
    """The Canvas zip: manifest, ``Q/Q.xml`` and ``Q/assessment_meta.xml`` (exports.md §1)."""
    return zip_bytes(
        [
            ("imsmanifest.xml", xml_bytes(_manifest(quiz))),
            (
                f"{quiz.id}/{quiz.id}.xml",
                xml_bytes(build_questestinterop(quiz, mode, "tagged", "canvas")),
            ),
            (f"{quiz.id}/assessment_meta.xml", xml_bytes(_assessment_meta(quiz, mode))),
        ]
    )
