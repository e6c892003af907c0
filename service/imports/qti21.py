"""QTI 2.1 content packages and single items → a draft quiz.

kgrade's own packages (layout in ``service/exports/qti21.py``'s docstring) hold one test per
language under ``--lang all``, each item ``I-L`` in language ``L``; their language versions are
merged back into one item per question. Foreign packages are read the same way: every test's
items in order (or every item resource when there is no test), ``choiceInteraction`` only.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from lxml import etree

from item_bank.model import LANGUAGES
from service.imports._build import DraftItem, DraftOption, DraftQuiz, note_reduced
from service.imports._safe import (
    ImportFailed,
    Package,
    child,
    children,
    descendants,
    local,
    resolve,
)
from service.imports._text import XML_LANG, Pieces, norm_lang, read_element

FORMAT = "QTI 2.1"
_FEEDBACK_IN_BODY = ("feedbackInline", "feedbackBlock")


def _lang(el: etree._Element, default: str | None) -> str | None:
    value = el.get(XML_LANG)
    return norm_lang(value) if value else default


def _read(draft: DraftQuiz, els: list[etree._Element], lang: str | None, label: str) -> Pieces:
    """Language versions of ``els`` read as one block; untagged text is in ``lang``."""
    wrapper = etree.Element("div")
    for el in els:
        wrapper.append(copy.deepcopy(el))
    pieces = note_reduced(draft, label, read_element(wrapper))
    return [(piece_lang or lang, text) for piece_lang, text in pieces]


@dataclass
class _Version:
    """One assessmentItem: the key groups language versions of the same question."""

    key: str
    lang: str | None
    root: etree._Element


def _version(path: str, root: etree._Element) -> _Version:
    ident = root.get("identifier") or path
    lang = _lang(root, None)
    base, _, suffix = ident.rpartition("-")
    key = base if base and lang and suffix == lang and suffix in LANGUAGES else ident
    return _Version(key, lang, root)


def _points(root: etree._Element) -> float | None:
    for f in descendants(root, "instructureField"):  # Canvas's converter keeps its points here
        if f.get("name") == "points_possible":
            try:
                return float(f.get("value") or "")
            except ValueError:
                return None
    for od in children(root, "outcomeDeclaration"):
        if od.get("identifier") == "MAXSCORE":
            values = descendants(od, "value")
            if values:
                try:
                    return float(values[0].text or "")
                except ValueError:
                    return None
    for od in children(root, "outcomeDeclaration"):
        if od.get("identifier") == "SCORE" and od.get("normalMaximum"):
            try:
                return float(od.get("normalMaximum") or "")
            except ValueError:
                return None
    return 1.0  # match_correct and friends: one point for the right response


def _scored_choices(root: etree._Element, choices: set[str]) -> set[str]:
    """Choices whose own condition sets SCORE to a positive value (Canvas's converter writes
    no correctResponse, only such rules)."""
    out: set[str] = set()
    for rif in descendants(root, "responseIf") + descendants(root, "responseElseIf"):
        test = rif[0] if len(rif) else None
        if test is None or local(test) not in ("match", "member"):
            continue
        tested = [(b.text or "").strip() for b in children(test, "baseValue")]
        for so in children(rif, "setOutcomeValue"):
            values = [b.text or "" for b in descendants(so, "baseValue")]
            if so.get("identifier") == "SCORE" and values and _positive(values[0]):
                out.update(t for t in tested if t in choices)
    return out


def _positive(raw: str) -> bool:
    try:
        return float(raw) > 0
    except ValueError:
        return False


def _correct(root: etree._Element, response: str, choices: set[str]) -> set[str]:
    found = _declared_correct(root, response)
    return found or _scored_choices(root, choices)


def _declared_correct(root: etree._Element, response: str) -> set[str]:
    for rd in children(root, "responseDeclaration"):
        if rd.get("identifier") != response:
            continue
        cr = child(rd, "correctResponse")
        if cr is not None:
            return {(v.text or "").strip() for v in children(cr, "value")}
        mapping = child(rd, "mapping")
        if mapping is not None:
            return {
                me.get("mapKey", "")
                for me in children(mapping, "mapEntry")
                if float(me.get("mappedValue", "0") or 0) > 0
            }
    return set()


CORRECT, INCORRECT = "\x00correct", "\x00incorrect"


def _feedback_links(root: etree._Element, choices: set[str]) -> dict[str, str]:
    """feedback id → choice id, from conditions that test one choice and add a feedback id;
    or → CORRECT / INCORRECT, set where the response is (not) the correct one."""
    out: dict[str, str] = {}
    for rif in descendants(root, "responseIf"):
        test = rif[0] if len(rif) else None
        if test is None or local(test) != "match" or not descendants(test, "correct"):
            continue
        for so in children(rif, "setOutcomeValue"):
            for bv in descendants(so, "baseValue"):
                out.setdefault((bv.text or "").strip(), CORRECT)
        other = rif.getnext()
        if other is not None and local(other) == "responseElse":
            for so in children(other, "setOutcomeValue"):
                for bv in descendants(so, "baseValue"):
                    out.setdefault((bv.text or "").strip(), INCORRECT)
    for rif in descendants(root, "responseIf") + descendants(root, "responseElseIf"):
        tested = [
            (bv.text or "").strip()
            for bv in descendants(rif, "baseValue")
            if (bv.text or "").strip() in choices
            and bv.getparent() is not None
            and local(bv.getparent()) in ("match", "member")
        ]
        if len(tested) != 1:
            continue
        for so in descendants(rif, "setOutcomeValue"):
            for bv in descendants(so, "baseValue"):
                out.setdefault((bv.text or "").strip(), tested[0])
    return out


def _item(draft: DraftQuiz, v: _Version) -> DraftItem | None:
    root = v.root
    name = root.get("title") or v.key
    label = f"question {name!r}"
    body = child(root, "itemBody")
    inter = [
        d for d in (body.iter() if body is not None else []) if local(d).endswith("Interaction")
    ]
    kinds = sorted({local(d) for d in inter})
    if kinds != ["choiceInteraction"] or len(inter) != 1:
        what = ", ".join(kinds) or "no interaction"
        draft.warnings.append(
            f"question {name!r}: {what} is not supported (only one choiceInteraction); skipped"
        )
        return None
    assert body is not None
    ci = inter[0]
    # The question: body content around the interaction, then the interaction's prompt.
    stem = [c for c in body if c is not ci and ci not in c.iterdescendants()]
    prompt_el = child(ci, "prompt")
    prompt = _read(draft, stem + ([prompt_el] if prompt_el is not None else []), v.lang, label)
    choices = children(ci, "simpleChoice")
    ids = [c.get("identifier") or "" for c in choices]
    correct = _correct(root, ci.get("responseIdentifier") or "RESPONSE", set(ids))
    links = _feedback_links(root, set(ids))
    fbs: dict[str, Pieces] = {}
    explanation: Pieces = []
    lost: list[str] = []
    for mf in descendants(root, "modalFeedback"):
        fid = mf.get("identifier") or ""
        text = _read(draft, [mf], v.lang, f"{label} feedback")
        target = (
            "general" if fid == "general_fb"
            else next(iter(correct)) if fid == "correct_fb" and len(correct) == 1
            else fid if fid in ids
            else f"RESPONSE_{fid[9:-3]}" if fid.startswith("FEEDBACK_") and fid.endswith("_fb")
            else links.get(fid)
        )  # fmt: skip
        if target == CORRECT and len(correct) == 1:
            target = next(iter(correct))
        if target == "general":
            explanation = text
        elif target == INCORRECT:
            # The one "wrong answer" comment stands for each wrong answer without its own.
            for cid in ids:
                if cid not in correct:
                    fbs.setdefault(cid, text)
        elif target in ids and target not in fbs:
            fbs[target] = text
        elif text:
            lost.append(fid)
    if lost:
        draft.warnings.append(f"{label}: feedback not linked to one answer, not imported: {lost}")
    if any(descendants(root, t) for t in _FEEDBACK_IN_BODY):
        draft.warnings.append(f"{label}: inline feedback (feedbackInline/Block) is not imported")
    options = [
        DraftOption(
            _read(draft, [c], v.lang, f"{label} answer {n}"), cid in correct, fbs.get(cid, [])
        )
        for n, (c, cid) in enumerate(zip(choices, ids, strict=True), start=1)
    ]
    shuffle = ci.get("shuffle")
    max_choices = ci.get("maxChoices", "1")
    kind = "multiple_choice" if max_choices == "1" else "multiple_answers"
    if kind == "multiple_choice" and _true_false(options):
        kind = "true_false"  # QTI has no such type; two choices saying True and False are one
    return DraftItem(
        label=name,
        type=kind,
        prompt=prompt,
        options=options,
        explanation=explanation,
        id_hint=v.key,
        points=_points(root),
        shuffle=None if shuffle is None else shuffle == "true",
    )


def _true_false(options: list[DraftOption]) -> bool:
    words = sorted(t.strip().rstrip(".").lower() for o in options for lang, t in o.text[:1])
    return len(options) == 2 and words == ["false", "true"]


def _merge(into: Pieces, more: Pieces) -> None:
    have = {lang for lang, _ in into}
    into.extend((lang, t) for lang, t in more if lang not in have)


def _merge_item(base: DraftItem, other: DraftItem) -> None:
    _merge(base.prompt, other.prompt)
    _merge(base.explanation, other.explanation)
    for a, b in zip(base.options, other.options, strict=False):
        _merge(a.text, b.text)
        _merge(a.feedback, b.feedback)


def read_items(files: list[tuple[str, etree._Element]], fmt: str) -> DraftQuiz:
    draft = DraftQuiz(format=fmt, title=[])
    versions = [_version(p, r) for p, r in files if local(r) == "assessmentItem"]
    merged: dict[str, DraftItem | None] = {}
    for v in versions:
        it = _item(draft, v) if v.key not in merged or merged[v.key] is not None else None
        if v.key not in merged:
            merged[v.key] = it
        elif it is not None and merged[v.key] is not None:
            _merge_item(merged[v.key], it)  # type: ignore[arg-type]
    draft.items = [it for it in merged.values() if it is not None]
    draft.warnings.append(
        "QTI 2.1 does not carry the quiz description, attempts, time limit, scoring policy or "
        "re-answering; the bank's defaults apply"
    )
    return draft


def _strip_lang_name(title: str) -> str:
    for name in LANGUAGES.values():
        if title.endswith(f" ({name})"):
            return title[: -len(name) - 3]
    return title


def read_package(pkg: Package, manifest: etree._Element | None) -> DraftQuiz:
    files: list[tuple[str, etree._Element]] = []
    titles: Pieces = []
    test_ids: list[str] = []
    seen: set[str] = set()
    resources = descendants(manifest, "resource") if manifest is not None else []
    tests = [r for r in resources if (r.get("type") or "").startswith("imsqti_test_xmlv2p")]
    for res in tests:
        file_el = child(res, "file")
        href = res.get("href") or (file_el.get("href") if file_el is not None else None)
        if not href:
            continue
        test = pkg.xml(href)
        test_ids.append(test.get("identifier") or "")
        first_lang = None
        for ref in descendants(test, "assessmentItemRef"):
            path = resolve(href, ref.get("href") or "")
            if path in seen:
                continue
            seen.add(path)
            root = pkg.xml(path)
            first_lang = first_lang or _lang(root, None)
            files.append((path, root))
        titles.append((first_lang, _strip_lang_name(test.get("title") or "")))
    if not tests:
        items = [r for r in resources if (r.get("type") or "").startswith("imsqti_item_xmlv2p")]
        paths = [r.get("href") or "" for r in items] or sorted(
            n for n in pkg.names if n.endswith(".xml") and n != "imsmanifest.xml"
        )
        for path in paths:
            root = pkg.xml(path)
            if local(root) == "assessmentItem":
                files.append((path, root))
    if not files:
        raise ImportFailed("the QTI 2.1 package holds no assessment items")
    draft = read_items(files, FORMAT)
    draft.title = [(lang, t) for lang, t in titles if t]
    if len(tests) > 1:
        ids = [i.rsplit("-", 1)[0] if i.rsplit("-", 1)[-1] in LANGUAGES else i for i in test_ids]
        draft.id_hint = ids[0] if ids else None
        draft.warnings.append(
            f"{len(tests)} tests in the package: read as language versions of one quiz"
        )
    elif test_ids:
        draft.id_hint = test_ids[0]
    return draft
