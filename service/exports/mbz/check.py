"""Structure checks for a quiz ``.mbz`` (Moodle backups have no schema).

What Moodle's restore needs to find, and the grade arithmetic this format exists for: every
slot's mark equals its question's default mark, the quiz's ``sumgrades`` is their sum, and the
gradebook item's maximum is the quiz's grade. Used by ``kgrade export --check`` and the tests.
"""

from __future__ import annotations

import io
import zipfile
from decimal import Decimal

from lxml import etree

from service.exports.mbz.layout import ACTIVITY_DIR

DECLARATION = b'<?xml version="1.0" encoding="UTF-8"?>'
PARSER = etree.XMLParser(no_network=True, resolve_entities=False)

#: Files a one-activity restore opens unconditionally (restore_structure_step fails without).
REQUIRED = (
    "moodle_backup.xml",
    "files.xml",
    "questions.xml",
    "roles.xml",
    "groups.xml",
    "scales.xml",
    "outcomes.xml",
    f"{ACTIVITY_DIR}/module.xml",
    f"{ACTIVITY_DIR}/quiz.xml",
    f"{ACTIVITY_DIR}/inforef.xml",
    f"{ACTIVITY_DIR}/grades.xml",
    f"{ACTIVITY_DIR}/grade_history.xml",
    f"{ACTIVITY_DIR}/roles.xml",
    f"{ACTIVITY_DIR}/calendar.xml",
    f"{ACTIVITY_DIR}/competencies.xml",
)


def _num(el: etree._Element, path: str) -> Decimal:
    return Decimal(el.findtext(path) or "NaN")


def _question_problems(qn: etree._Element) -> list[str]:
    name = qn.findtext("name")
    qtype = qn.findtext("qtype")
    plugin = qn.find(f"plugin_qtype_{qtype}_question")
    if plugin is None:
        return [f"question {name}: no plugin_qtype_{qtype}_question"]
    answers = plugin.findall("answers/answer")
    fractions = [_num(a, "fraction") for a in answers]
    problems = []
    if qtype == "truefalse":
        tf = plugin.find("truefalse")
        ids = {a.get("id") for a in answers}
        if tf is None or {tf.findtext("trueanswer"), tf.findtext("falseanswer")} != ids:
            problems.append(f"question {name}: trueanswer/falseanswer are not its two answers")
        if sorted(fractions) != [0, 1]:
            problems.append(f"question {name}: a true/false needs one right answer")
    elif qtype == "multichoice":
        single = plugin.findtext("multichoice/single") == "1"
        if single and max(fractions, default=Decimal(0)) != 1:
            problems.append(f"question {name}: no answer earns full marks")
        positive = sum(f for f in fractions if f > 0)
        if not single and abs(positive - 1) > Decimal("0.000001"):
            problems.append(f"question {name}: right answers add up to {positive}, not 1")
    else:
        problems.append(f"question {name}: unexpected qtype {qtype!r}")
    return problems


def _grade_problems(docs: dict[str, etree._Element]) -> list[str]:
    questions = {
        e.get("id"): e.find("question_version/question_versions/questions/question")
        for e in docs["questions.xml"].iter("question_bank_entry")
    }
    quiz = docs[f"{ACTIVITY_DIR}/quiz.xml"].find("quiz")
    if quiz is None:
        return ["quiz.xml: no <quiz>"]
    problems: list[str] = []
    total = Decimal(0)
    for inst in quiz.iterfind("question_instances/question_instance"):
        entry = inst.findtext("question_reference/questionbankentryid")
        qn = questions.get(entry)
        if qn is None:
            problems.append(f"slot {inst.findtext('slot')}: no question bank entry {entry}")
            continue
        maxmark = _num(inst, "maxmark")
        total += maxmark
        if maxmark != _num(qn, "defaultmark"):
            problems.append(
                f"slot {inst.findtext('slot')}: mark {maxmark} but question "
                f"{qn.findtext('name')} is worth {_num(qn, 'defaultmark')}"
            )
    if total == 0:
        problems.append("quiz.xml: no question slots")
    if _num(quiz, "sumgrades") != total:
        problems.append(
            f"quiz.xml: sumgrades {_num(quiz, 'sumgrades')} but slots add up to {total}"
        )
    item = docs[f"{ACTIVITY_DIR}/grades.xml"].find("grade_items/grade_item")
    if item is None or _num(item, "grademax") != _num(quiz, "grade"):
        problems.append("grades.xml: the gradebook maximum is not the quiz's grade")
    for qn in questions.values():
        if qn is not None:
            problems.extend(_question_problems(qn))
    return problems


def mbz_problems(data: bytes) -> list[str]:
    """Problems found in a quiz backup (empty list: restorable as far as structure goes)."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        return ["moodle-mbz: not a zip file"]
    names = set(zf.namelist())
    missing = [n for n in REQUIRED if n not in names]
    if missing:
        return [f"moodle-mbz: missing {n}" for n in missing]
    docs: dict[str, etree._Element] = {}
    for name in sorted(n for n in names if n.endswith(".xml")):
        raw = zf.read(name)
        try:
            docs[name] = etree.fromstring(raw, PARSER)
        except etree.XMLSyntaxError as exc:
            return [f"{name}: not well-formed XML: {exc}"]
    head = zf.read("moodle_backup.xml")[:200]
    # convert_helper::detect_moodle2_format reads only these bytes.
    if not head.startswith(DECLARATION) or b"<moodle_backup>" not in head:
        return ["moodle_backup.xml: Moodle would not detect a Moodle 2 backup (declaration)"]
    info = docs["moodle_backup.xml"].find("information")
    if info is None or info.findtext("details/detail/format") != "moodle2":
        return ["moodle_backup.xml: no moodle2 <information>"]
    dirs = [a.findtext("directory") for a in info.iterfind("contents/activities/activity")]
    if dirs != [ACTIVITY_DIR]:
        return [f"moodle_backup.xml: activities {dirs}, expected [{ACTIVITY_DIR!r}]"]
    return _grade_problems(docs)
