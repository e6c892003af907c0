"""The quiz activity's files in ``activities/quiz_<id>/``: the quiz with its slots, the course
module, its gradebook item, and the empty parts every activity restore step opens.

Field lists follow Moodle 4.5's backup code (mod/quiz/backup/moodle2/backup_quiz_stepslib.php,
backup/moodle2/backup_stepslib.php). The marks are the point of this format: each slot's
``maxmark`` is the item's points and ``sumgrades``/``grade`` their total, which Moodle's restore
keeps as written (the Common Cartridge converter writes 1 and 4 whatever the file says).
"""

from __future__ import annotations

from lxml import etree

from item_bank.model import Quiz
from service.exports._common import HtmlStyle, html_block, html_inline, pieces, sub
from service.exports.mbz.layout import (
    BACKUP_TIME,
    GRADE_ITEM_ID,
    MODULE_CONTEXT_ID,
    MODULE_ID,
    MOODLE_VERSION,
    NULL,
    QUIZ_CATEGORY_ID,
    QUIZ_ID,
    SECTION_ID,
    TOP_CATEGORY_ID,
    empty,
    fields,
    grade,
    mark,
)

#: mod/quiz/classes/question/display_options.php: when a review item is shown.
DURING, IMMEDIATELY_AFTER, LATER_WHILE_OPEN, AFTER_CLOSE = 0x10000, 0x01000, 0x00100, 0x00010
ALWAYS = DURING | IMMEDIATELY_AFTER | LATER_WHILE_OPEN | AFTER_CLOSE
#: Overall feedback only exists once an attempt is finished, so Moodle stores it without DURING.
AFTER = IMMEDIATELY_AFTER | LATER_WHILE_OPEN | AFTER_CLOSE

#: kgrade's scoring policy → quiz.grademethod (QUIZ_GRADEHIGHEST = 1, QUIZ_ATTEMPTLAST = 4).
GRADE_METHODS = {"keep_highest": "1", "keep_latest": "4"}


def total_points(quiz: Quiz) -> float:
    return sum(item.points for item in quiz.items)


def quiz_name(quiz: Quiz, mode: str, style: HtmlStyle) -> str:
    """The activity name. Moodle filters names through multilang ("content and headings"), so
    ``--lang all`` writes the same markup as the questions; one language is plain text."""
    ps = pieces(quiz.title, mode, quiz.source_lang)
    return html_inline(ps, style) if len(ps) > 1 else ps[0][1]


def behaviour(quiz: Quiz) -> str:
    """kgrade shows each answer's feedback at once; re-answering maps to adaptive without
    penalty, a single answer per question to immediate feedback."""
    return "adaptivenopenalty" if quiz.settings.allow_reanswer else "immediatefeedback"


def _slot(parent: etree._Element, n: int, points: float) -> None:
    inst = sub(parent, "question_instance", id=str(n))
    fields(
        inst,
        [
            ("quizid", str(QUIZ_ID)),
            ("slot", str(n)),
            ("page", str(n)),  # one question per page, as kgrade delivers by default
            ("displaynumber", NULL),
            ("requireprevious", "0"),
            ("maxmark", mark(points)),
            ("quizgradeitemid", NULL),
        ],
    )
    ref = sub(inst, "question_reference", id=str(n))
    fields(
        ref,
        [
            ("usingcontextid", str(MODULE_CONTEXT_ID)),
            ("component", "mod_quiz"),
            ("questionarea", "slot"),
            ("questionbankentryid", str(n)),  # questions.py numbers entries in item order
            ("version", NULL),  # always the latest version
        ],
    )


def quiz_xml(quiz: Quiz, mode: str, style: HtmlStyle) -> etree._Element:
    s = quiz.settings
    total = total_points(quiz)
    root = etree.Element(
        "activity",
        id=str(QUIZ_ID),
        moduleid=str(MODULE_ID),
        modulename="quiz",
        contextid=str(MODULE_CONTEXT_ID),
    )
    q = sub(root, "quiz", id=str(QUIZ_ID))
    fields(
        q,
        [
            ("name", quiz_name(quiz, mode, style)),
            ("intro", html_block(pieces(quiz.description, mode, quiz.source_lang), style)),
            ("introformat", "1"),
            ("timeopen", "0"),
            ("timeclose", "0"),
            ("timelimit", str((s.time_limit_minutes or 0) * 60)),
            ("overduehandling", "autosubmit"),
            ("graceperiod", "0"),
            ("preferredbehaviour", behaviour(quiz)),
            ("canredoquestions", "0"),
            ("attempts_number", str(s.allowed_attempts or 0)),  # 0: unlimited
            ("attemptonlast", "0"),
            ("grademethod", GRADE_METHODS.get(s.scoring_policy, "1")),
            ("decimalpoints", "2"),
            ("questiondecimalpoints", "-1"),
            # Students see everything (their answer, right or not, marks, feedback, the right
            # answer) during and after the attempt, as in kgrade's own delivery.
            ("reviewattempt", str(ALWAYS)),
            ("reviewcorrectness", str(ALWAYS)),
            ("reviewmaxmarks", str(ALWAYS)),
            ("reviewmarks", str(ALWAYS)),
            ("reviewspecificfeedback", str(ALWAYS)),
            ("reviewgeneralfeedback", str(ALWAYS)),
            ("reviewrightanswer", str(ALWAYS)),
            ("reviewoverallfeedback", str(AFTER)),
            ("questionsperpage", "1"),
            ("navmethod", "free"),
            ("shuffleanswers", "1" if s.shuffle_answers else "0"),
            ("sumgrades", grade(total)),
            # Maximum grade = total points, so the gradebook shows points as Canvas does.
            ("grade", grade(total)),
            ("timecreated", BACKUP_TIME),
            ("timemodified", BACKUP_TIME),
            ("password", ""),
            ("subnet", ""),
            ("browsersecurity", "-"),
            ("delay1", "0"),
            ("delay2", "0"),
            ("showuserpicture", "0"),
            ("showblocks", "0"),
            ("completionattemptsexhausted", "0"),
            ("completionminattempts", "0"),
            ("allowofflineattempts", "0"),
        ],
    )
    sub(q, "quiz_grade_items", "")
    slots = sub(q, "question_instances")
    for n, item in enumerate(quiz.items, start=1):
        _slot(slots, n, item.points)
    section = sub(sub(q, "sections"), "section", id="1")
    fields(section, [("firstslot", "1"), ("heading", ""), ("shufflequestions", "0")])
    fb = sub(sub(q, "feedbacks"), "feedback", id="1")
    # One empty overall-feedback band covering every grade, as Moodle's quiz form saves it.
    fields(
        fb,
        [
            ("feedbacktext", ""),
            ("feedbacktextformat", "1"),
            ("mingrade", grade(0)),
            ("maxgrade", grade(total + 1)),
        ],
    )
    for tag in ("overrides", "grades", "attempts"):
        sub(q, tag, "")
    return root


def module_xml() -> etree._Element:
    root = etree.Element("module", id=str(MODULE_ID), version=MOODLE_VERSION)
    fields(
        root,
        [
            ("modulename", "quiz"),
            ("sectionid", str(SECTION_ID)),
            ("sectionnumber", "0"),  # the course's first (general) section
            ("idnumber", ""),
            ("added", BACKUP_TIME),
            ("score", "0"),
            ("indent", "0"),
            ("visible", "1"),
            ("visibleoncoursepage", "1"),
            ("visibleold", "1"),
            ("groupmode", "0"),
            ("groupingid", "0"),
            ("completion", "0"),
            ("completiongradeitemnumber", NULL),
            ("completionpassgrade", "0"),
            ("completionview", "0"),
            ("completionexpected", "0"),
            ("availability", NULL),
            ("showdescription", "0"),
            ("downloadcontent", "1"),
            ("lang", NULL),
        ],
    )
    sub(root, "tags", "")
    return root


def grades_xml(quiz: Quiz, mode: str, style: HtmlStyle) -> etree._Element:
    """The quiz's gradebook column, with the same maximum as the quiz's grade."""
    root = etree.Element("activity_gradebook")
    item = sub(sub(root, "grade_items"), "grade_item", id=str(GRADE_ITEM_ID))
    fields(
        item,
        [
            ("categoryid", NULL),  # restore puts it in the target course's top grade category
            ("itemname", quiz_name(quiz, mode, style)),
            ("itemtype", "mod"),
            ("itemmodule", "quiz"),
            ("iteminstance", str(QUIZ_ID)),
            ("itemnumber", "0"),
            ("iteminfo", NULL),
            ("idnumber", ""),
            ("calculation", NULL),
            ("gradetype", "1"),  # GRADE_TYPE_VALUE
            ("grademax", grade(total_points(quiz))),
            ("grademin", grade(0)),
            ("scaleid", NULL),
            ("outcomeid", NULL),
            ("gradepass", grade(0)),
            ("multfactor", grade(1)),
            ("plusfactor", grade(0)),
            ("aggregationcoef", grade(0)),
            ("aggregationcoef2", grade(0)),
            ("weightoverride", "0"),
            ("sortorder", "2"),
            ("display", "0"),
            ("decimals", NULL),
            ("hidden", "0"),
            ("locked", "0"),
            ("locktime", "0"),
            ("needsupdate", "0"),
            ("timecreated", BACKUP_TIME),
            ("timemodified", BACKUP_TIME),
        ],
    )
    sub(item, "grade_grades", "")
    sub(root, "grade_letters", "")
    return root


def inforef_xml() -> etree._Element:
    """The question categories the activity uses: restore loads these into its id map."""
    root = etree.Element("inforef")
    refs = sub(root, "question_categoryref")
    for cid in (TOP_CATEGORY_ID, QUIZ_CATEGORY_ID):
        sub(sub(refs, "question_category"), "id", str(cid))
    return root


def files(quiz: Quiz, mode: str, style: HtmlStyle) -> list[tuple[str, etree._Element]]:
    """``(name in the activity folder, root element)`` for every file a restore step opens."""
    return [
        ("module.xml", module_xml()),
        ("quiz.xml", quiz_xml(quiz, mode, style)),
        ("inforef.xml", inforef_xml()),
        ("grades.xml", grades_xml(quiz, mode, style)),
        ("grade_history.xml", empty("grade_history", "grade_grades")),
        ("roles.xml", empty("roles", "role_overrides", "role_assignments")),
        ("filters.xml", empty("filters", "filter_actives", "filter_configs")),
        ("calendar.xml", empty("events")),
        ("competencies.xml", _competencies()),
    ]


def _competencies() -> etree._Element:
    root = etree.Element("course_module_competencies")
    sub(root, "competencies", "")
    return root
