"""QTI 1.2 (Canvas zips, the CC 1.1 profile inside ``.imscc``, bare ``questestinterop``).

The two flavours kgrade writes (exports.md §1 and §3) lay out response processing differently;
reading is one rule for both: an answer is correct when a row that sets a positive SCORE
matches it (not under ``<not>``), and a feedback belongs to the answer its row's one
``varequal`` names (else to ``<ident>_fb``'s answer, as Canvas names them).
"""

from __future__ import annotations

from lxml import etree

from service.exports.qti12 import CANVAS_TYPES, CC_PROFILES
from service.imports._build import DraftItem, DraftOption, DraftQuiz, note_reduced
from service.imports._safe import child, child_text, children, descendants, local
from service.imports._text import Pieces, read_html, read_plain

TYPE_BY_CANVAS = {v: k for k, v in CANVAS_TYPES.items()}
TYPE_BY_PROFILE = {v: k for k, v in CC_PROFILES.items()}


def _meta(el: etree._Element) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in descendants(el, "qtimetadatafield"):
        label = (child_text(f, "fieldlabel") or "").strip()
        if label and label not in out:
            out[label] = (child_text(f, "fieldentry") or "").strip()
    return out


def _mattext(draft: DraftQuiz, holder: etree._Element | None, label: str) -> Pieces:
    """The first mattext under ``holder`` (material, flow_mat, flow...)."""
    if holder is None:
        return []
    for mt in holder.iter():
        if local(mt) == "mattext":
            html = (mt.get("texttype") or "text/plain").lower() == "text/html"
            reading = read_html(mt.text, is_html=True) if html else read_plain(mt.text)
            return note_reduced(draft, label, reading)
        if local(mt) in ("matimage", "mataudio", "matvideo"):
            draft.warnings.append(f"{label}: {local(mt)} is not imported")
    return []


def _first_material(el: etree._Element) -> etree._Element | None:
    """The question text's material: directly in presentation or in its first flow."""
    for c in el.iter():
        if local(c) in ("response_lid", "response_str", "response_num", "response_grp"):
            return None
        if local(c) == "material":
            return c
    return None


def _positive(value: str | None) -> bool:
    try:
        return value is not None and float(value) > 0
    except ValueError:
        return False


def _row_matches(cond: etree._Element) -> tuple[list[str], list[str]]:
    """(idents this condition requires, idents it only excludes)."""
    wanted, excluded = [], []
    for ve in descendants(cond, "varequal"):
        ident = (ve.text or "").strip()
        if any(local(a) == "not" for a in ve.iterancestors() if a is not cond):
            excluded.append(ident)
        else:
            wanted.append(ident)
    return wanted, excluded


def _item_type(meta: dict[str, str], item: etree._Element) -> str | None:
    """The bank type, or None with the file's own type name left for the warning."""
    if "question_type" in meta:
        return TYPE_BY_CANVAS.get(meta["question_type"])
    if "cc_profile" in meta:
        return TYPE_BY_PROFILE.get(meta["cc_profile"])
    lids = descendants(item, "response_lid")
    if len(lids) != 1 or not descendants(lids[0], "render_choice"):
        return None
    return "multiple_answers" if lids[0].get("rcardinality") == "Multiple" else "multiple_choice"


def _type_name(meta: dict[str, str], item: etree._Element) -> str:
    if "question_type" in meta or "cc_profile" in meta:
        return meta.get("question_type") or meta["cc_profile"]
    kinds = {local(d) for d in item.iter()} & {"response_str", "response_num", "response_grp"}
    return ", ".join(sorted(kinds)) or "unknown"


def _item(draft: DraftQuiz, item: etree._Element, n: int) -> DraftItem | None:
    ident = item.get("ident") or f"#{n}"
    name = item.get("title") or ident
    label = f"question {name!r}"
    meta = _meta(item)
    kind = _item_type(meta, item)
    if kind is None:
        draft.warnings.append(
            f"question {name!r}: type {_type_name(meta, item)!r} is not supported "
            "(only multiple choice, multiple answers and true/false); skipped"
        )
        return None
    pres = child(item, "presentation")
    prompt = _mattext(draft, _first_material(pres) if pres is not None else None, label)
    answers: list[tuple[str, Pieces]] = []
    for n_ans, rl in enumerate(descendants(pres, "response_label") if pres is not None else [], 1):
        answers.append((rl.get("ident") or "", _mattext(draft, rl, f"{label} answer {n_ans}")))

    feedbacks = {
        fb.get("ident") or "": _mattext(draft, fb, f"{label} feedback")
        for fb in children(item, "itemfeedback")
    }
    correct: set[str] = set()
    by_answer: dict[str, list[str]] = {}  # answer ident → feedback ids
    general: list[str] = []
    for rp in descendants(item, "resprocessing"):
        for rc in children(rp, "respcondition"):
            cond = child(rc, "conditionvar")
            if cond is None:
                continue
            wanted, excluded = _row_matches(cond)
            scores = [sv for sv in children(rc, "setvar") if _positive(sv.text)]
            links = [d.get("linkrefid") or "" for d in children(rc, "displayfeedback")]
            if scores:
                correct.update(wanted)
            direct = [c for c in cond if local(c) == "varequal"]
            if len(direct) == 1 and len(wanted) == 1 and not excluded:
                by_answer.setdefault(wanted[0], []).extend(links)
            elif child(cond, "other") is not None and not wanted:
                general.extend(links)
    if not correct:
        draft.warnings.append(f"{label}: no scoring row marks an answer correct")

    used: set[str] = set()
    options: list[DraftOption] = []
    for aid, text in answers:
        fids = [f for f in by_answer.get(aid, []) if f != "general_fb"]
        if not fids and f"{aid}_fb" in feedbacks:
            fids = [f"{aid}_fb"]
        fb: Pieces = []
        for f in fids:
            if feedbacks.get(f) and not fb:
                fb = feedbacks[f]
                used.add(f)
        options.append(DraftOption(text, aid in correct, fb))
    # Canvas's correct_fb is the single correct answer's comment (exports.md §1).
    right = [o for o, (aid, _) in zip(options, answers, strict=True) if aid in correct]
    if "correct_fb" in feedbacks and len(right) == 1 and not right[0].feedback:
        right[0].feedback = feedbacks["correct_fb"]
        used.add("correct_fb")
    explanation: Pieces = []
    for f in ["general_fb", *general]:
        if feedbacks.get(f) and f not in used:
            explanation = feedbacks[f]
            used.add(f)
            break
    lost = [f for f, ps in feedbacks.items() if ps and f not in used]
    if lost:
        draft.warnings.append(f"{label}: feedback not carried by the bank: {', '.join(lost)}")

    points = meta.get("points_possible") or meta.get("cc_weighting")
    rc = next(iter(descendants(pres, "render_choice")), None) if pres is not None else None
    shuffle = (rc.get("shuffle") or "").lower() if rc is not None else ""
    return DraftItem(
        shuffle=None if shuffle not in ("yes", "no") else shuffle == "yes",
        label=name,
        type=kind,
        prompt=prompt,
        options=options,
        explanation=explanation,
        id_hint=ident,
        points=float(points) if points and _is_number(points) else None,
    )


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def read_questestinterop(root: etree._Element, fmt: str) -> DraftQuiz:
    assessment = next(iter(descendants(root, "assessment")), None)
    title = (assessment.get("title") if assessment is not None else None) or ""
    draft = DraftQuiz(
        format=fmt,
        title=read_plain(title).pieces,
        id_hint=assessment.get("ident") if assessment is not None else None,
    )
    if assessment is not None:
        meta = {k: v for k, v in _meta(assessment).items() if k.startswith(("qmd_", "cc_max"))}
        limit = meta.get("qmd_timelimit")
        if limit and limit.isdigit():
            draft.settings["time_limit_minutes"] = int(limit)
        attempts = meta.get("cc_maxattempts")
        if attempts == "unlimited":
            draft.settings["allowed_attempts"] = None
        elif attempts and attempts.isdigit():
            draft.settings["allowed_attempts"] = int(attempts)
    for n, item in enumerate(descendants(root, "item"), start=1):
        it = _item(draft, item, n)
        if it is not None:
            draft.items.append(it)
    return draft


def split_plain_title(draft: DraftQuiz) -> None:
    """Titles are plain text, languages joined by ' / ' (``_common.plain``): split them by the
    description's languages when the counts agree, else keep the whole title as one string."""
    langs = [lang for lang, _ in draft.description if lang]
    if len(draft.title) != 1 or not langs:
        return
    text = draft.title[0][1]
    parts = text.split(" / ")
    if len(langs) == 1:
        draft.title = [(langs[0], text)]
    elif len(parts) == len(langs):
        draft.title = list(zip(langs, parts, strict=True))
    else:
        draft.warnings.append(
            f"title: cannot tell its {len(langs)} languages apart; kept as one string"
        )


def read_canvas_meta(draft: DraftQuiz, meta: etree._Element) -> None:
    """Canvas's ``assessment_meta.xml``: title, description and the quiz settings."""

    def field(name: str) -> str | None:
        value = child_text(meta, name)
        return value.strip() if value is not None else None

    if field("title"):
        draft.title = read_plain(field("title")).pieces
    desc = field("description")
    if desc:
        draft.description = note_reduced(draft, "description", read_html(desc))
    s = draft.settings
    attempts = field("allowed_attempts")
    if attempts and attempts.lstrip("-").isdigit():
        s["allowed_attempts"] = None if int(attempts) < 0 else int(attempts)
    limit = field("time_limit")
    if limit and limit.isdigit():
        s["time_limit_minutes"] = int(limit)
    if field("scoring_policy") in ("keep_highest", "keep_latest"):
        s["scoring_policy"] = field("scoring_policy")
    if field("shuffle_answers") in ("true", "false"):
        s["shuffle_answers"] = field("shuffle_answers") == "true"
    if field("cant_go_back") in ("true", "false"):
        s["allow_reanswer"] = field("cant_go_back") == "false"
    split_plain_title(draft)
