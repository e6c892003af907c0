"""Fixed numbers and small writers shared by the parts of a Moodle 2 backup (``.mbz``).

A backup carries the ids of the site it came from; restore maps every one of them to new ids,
so they only have to be consistent inside the file. Fixed values (rather than counters or the
clock) keep the export byte-identical for the same bank, as every other format is.
"""

from __future__ import annotations

import hashlib
from decimal import Decimal

from lxml import etree

from service.exports._common import sub

#: Moodle 4.5.0's version (backup_version and mod_quiz's version). A restore refuses a backup
#: from a newer Moodle than itself, so the lowest 4.5 lets every 4.5.x site restore it, and
#: mod_quiz >= 2021091700 makes restore read 4.x question references (restore_quiz_stepslib.php).
MOODLE_VERSION = "2024100700"
MOODLE_RELEASE = "4.5"
#: 2026-01-01T00:00:00Z: creation/modification times and the "original course start date".
BACKUP_TIME = "1767225600"
#: Moodle's marker for SQL NULL in backup XML (backup/util/xml/output/xml_writer.class.php).
NULL = "$@NULL@$"

SYSTEM_CONTEXT_ID = 1
COURSE_ID = 2
COURSE_CONTEXT_ID = 2
MODULE_ID = 1
MODULE_CONTEXT_ID = 3
QUIZ_ID = 1
SECTION_ID = 1
TOP_CATEGORY_ID = 1
QUIZ_CATEGORY_ID = 2
GRADE_ITEM_ID = 1
#: Moodle's context levels (lib/accesslib.php): a course's question bank lives at course level.
CONTEXT_COURSE = "50"

ACTIVITY_DIR = f"activities/quiz_{MODULE_ID}"


def site_hash() -> str:
    """``original_site_identifier_hash``: matches no real site, so restore never treats the
    file as coming from the site it is restored into (which would map users and categories)."""
    return hashlib.md5(b"kgrade export: no Moodle site").hexdigest()


def fields(parent: etree._Element, values: list[tuple[str, str]]) -> None:
    """One child element per ``(tag, text)``, in order (Moodle reads them by name)."""
    for tag, text in values:
        sub(parent, tag, text)


def empty(root: str, *children: str) -> etree._Element:
    """A file with nothing to restore: the root and its empty lists."""
    el = etree.Element(root)
    for child in children:
        sub(el, child, "")
    return el


def mark(points: float) -> str:
    """A mark as Moodle stores ``maxmark``/``defaultmark`` (NUMBER(12,7))."""
    return f"{Decimal(str(points)):.7f}"


def grade(points: float) -> str:
    """A quiz grade or sum of marks as Moodle stores ``grade``/``sumgrades`` (NUMBER(10,5))."""
    return f"{Decimal(str(points)):.5f}"


def fraction(percent: str) -> str:
    """An answer's grade as a 0..1 fraction (NUMBER(12,7)) from a Moodle XML percentage."""
    return f"{Decimal(percent) / 100:.7f}"


def backup_xml(root: etree._Element) -> bytes:
    """UTF-8 XML with the declaration in double quotes: Moodle recognises a backup only when
    ``moodle_backup.xml`` starts with exactly ``<?xml version="1.0" encoding="UTF-8"?>``
    (convert_helper::detect_moodle2_format); lxml's own declaration uses single quotes."""
    body = etree.tostring(root, encoding="UTF-8", pretty_print=True)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + body
