"""Moodle 2 activity backup (``.mbz``) of one quiz with its question bank, for Moodle 4.5.

Restored with Moodle's own restore (course → Restore, or "restore as a new course"), the quiz
keeps the marks written here: each slot's mark is the item's points and the quiz's total and
maximum grade are their sum. A Common Cartridge cannot do that: Moodle's CC converter writes a
mark of 1 per question and a total of 4 whatever the cartridge says (docs/moodle.md).

The archive is a zip (Moodle's mbz packer reads zip and tar.gz) of the files Moodle 4.5 itself
writes for a one-activity backup without users: ``moodle_backup.xml`` (what the backup holds and
its settings), ``questions.xml``, the root lists restore opens, and ``activities/quiz_1/``.
"""

from __future__ import annotations

import hashlib

from lxml import etree

from item_bank.model import Quiz
from service.exports._common import HtmlStyle, plain, sub, zip_bytes
from service.exports.mbz import activity, questions
from service.exports.mbz.layout import (
    ACTIVITY_DIR,
    BACKUP_TIME,
    COURSE_CONTEXT_ID,
    COURSE_ID,
    MODULE_ID,
    MOODLE_RELEASE,
    MOODLE_VERSION,
    SECTION_ID,
    SYSTEM_CONTEXT_ID,
    backup_xml,
    empty,
    fields,
    site_hash,
)

ACTIVITY_KEY = f"quiz_{MODULE_ID}"

#: Root backup settings as Moodle writes them for an activity backup without user data.
#: Restore offers only what the backup says it holds, so users, logs and the like are 0.
ROOT_SETTINGS: tuple[tuple[str, str], ...] = (
    ("users", "0"),
    ("anonymize", "0"),
    ("role_assignments", "0"),
    ("activities", "1"),
    ("blocks", "0"),
    ("files", "1"),
    ("filters", "0"),
    ("comments", "0"),
    ("badges", "0"),
    ("calendarevents", "0"),
    ("userscompletion", "0"),
    ("logs", "0"),
    ("grade_histories", "0"),
    ("questionbank", "1"),
    ("groups", "0"),
    ("competencies", "0"),
    ("customfield", "0"),
    ("contentbankcontent", "0"),
    ("xapistate", "0"),
    ("legacyfiles", "0"),
)


def backup_filename(quiz: Quiz) -> str:
    return f"{quiz.id}.mbz"


def _setting(parent: etree._Element, level: str, name: str, value: str) -> None:
    s = sub(parent, "setting")
    sub(s, "level", level)
    if level == "activity":
        sub(s, "activity", ACTIVITY_KEY)
    sub(s, "name", name)
    sub(s, "value", value)


def moodle_backup_xml(quiz: Quiz, mode: str, style: HtmlStyle) -> etree._Element:
    """What the backup holds: Moodle reads this first to detect the format and plan restore."""
    root = etree.Element("moodle_backup")
    info = sub(root, "information")
    title = plain(quiz.title, "en" if mode == "all" else mode, quiz.source_lang)
    fields(
        info,
        [
            ("name", backup_filename(quiz)),
            ("moodle_version", MOODLE_VERSION),
            ("moodle_release", MOODLE_RELEASE),
            ("backup_version", MOODLE_VERSION),
            ("backup_release", MOODLE_RELEASE),
            ("backup_date", BACKUP_TIME),
            ("mnet_remoteusers", "0"),
            ("include_files", "1"),
            ("include_file_references_to_external_content", "0"),
            ("original_wwwroot", "https://kgrade.invalid"),
            ("original_site_identifier_hash", site_hash()),
            ("original_course_id", str(COURSE_ID)),
            ("original_course_format", "topics"),
            ("original_course_fullname", title),
            ("original_course_shortname", quiz.id),
            ("original_course_startdate", BACKUP_TIME),
            ("original_course_enddate", "0"),
            ("original_course_contextid", str(COURSE_CONTEXT_ID)),
            ("original_system_contextid", str(SYSTEM_CONTEXT_ID)),
        ],
    )
    # A stable id: the same quiz revision and options give the same file.
    backup_id = hashlib.md5(
        f"{quiz.id}\x1f{quiz.revision}\x1f{mode}\x1f{style}".encode()
    ).hexdigest()
    detail = sub(sub(info, "details"), "detail", backup_id=backup_id)
    fields(
        detail,
        [
            ("type", "activity"),
            ("format", "moodle2"),
            ("interactive", "1"),
            ("mode", "10"),  # backup::MODE_GENERAL
            ("execution", "1"),
            ("executiontime", "0"),
        ],
    )
    act = sub(sub(sub(info, "contents"), "activities"), "activity")
    fields(
        act,
        [
            ("moduleid", str(MODULE_ID)),
            ("sectionid", str(SECTION_ID)),
            ("modulename", "quiz"),
            ("title", activity.quiz_name(quiz, mode, style)),
            ("directory", ACTIVITY_DIR),
            ("insubsection", ""),
        ],
    )
    settings = sub(info, "settings")
    _setting(settings, "root", "filename", backup_filename(quiz))
    for name, value in ROOT_SETTINGS:
        _setting(settings, "root", name, value)
    _setting(settings, "activity", f"{ACTIVITY_KEY}_included", "1")
    _setting(settings, "activity", f"{ACTIVITY_KEY}_userinfo", "0")
    return root


def export(quiz: Quiz, mode: str, style: HtmlStyle) -> bytes:
    if not quiz.items:
        raise ValueError(f"quiz {quiz.id!r} has no items; a Moodle quiz backup needs one")
    # Each restore step opens its file and fails on a missing one (restore_structure_step), so
    # the empty lists are written too; the optional gradebook and history files are left out.
    parts: list[tuple[str, etree._Element]] = [
        ("moodle_backup.xml", moodle_backup_xml(quiz, mode, style)),
        ("files.xml", empty("files")),
        ("questions.xml", questions.build(quiz, mode, style)),
        ("roles.xml", empty("roles_definition")),
        ("groups.xml", empty("groups", "groupcustomfields", "groupings")),
        ("scales.xml", empty("scales_definition")),
        ("outcomes.xml", empty("outcomes_definition")),
        ("completion.xml", empty("course_completion")),
    ]
    parts += [(f"{ACTIVITY_DIR}/{name}", el) for name, el in activity.files(quiz, mode, style)]
    return zip_bytes((name, backup_xml(el)) for name, el in parts)
