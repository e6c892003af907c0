"""IMS Common Cartridge 1.1 for Moodle's course restore (exports.md §3).

Moodle core has no QTI question import; restoring a cartridge is the only QTI path into it.
The quiz itself is the CC profile of QTI 1.2 built by ``qti12.build_questestinterop``.

Shuffling: each item carries the profile's own flag, ``render_choice shuffle="Yes|No"``
(``_common.shuffles``). Moodle's restore does not read it: every restored multichoice question
gets "shuffle the choices" off (backup/cc/sheets, ``SHUFFLEANSWERS 0``), so for Moodle the
Moodle XML export, which carries ``<shuffleanswers>`` per question, is the one that shuffles.
"""

from __future__ import annotations

from lxml import etree

from item_bank.model import Quiz
from service.exports._common import HtmlStyle, html_inline, pieces, sub, xml_bytes, zip_bytes
from service.exports.qti12 import build_questestinterop

CC_NS = "http://www.imsglobal.org/xsd/imsccv1p1/imscp_v1p1"
LOM_NS = "http://ltsc.ieee.org/xsd/imsccv1p1/LOM/manifest"
ASSESSMENT_TYPE = "imsqti_xmlv1p2/imscc_xmlv1p1/assessment"


def qti_path(quiz: Quiz) -> str:
    return f"{quiz.id}/assessment_qti.xml"


def _manifest(quiz: Quiz, mode: str, style: HtmlStyle) -> etree._Element:
    # Moodle detects a CC 1.1 package by the *default* namespace declaration in the first 1024
    # bytes, so the manifest's own namespace is the default and is declared first.
    root = etree.Element(
        f"{{{CC_NS}}}manifest",
        nsmap={None: CC_NS, "lomimscc": LOM_NS},
        identifier=f"{quiz.id}-cc",
    )
    md = sub(root, f"{{{CC_NS}}}metadata")
    sub(md, f"{{{CC_NS}}}schema", "IMS Common Cartridge")
    sub(md, f"{{{CC_NS}}}schemaversion", "1.1.0")
    lom = sub(md, f"{{{LOM_NS}}}lom")
    general = sub(lom, f"{{{LOM_NS}}}general")
    title = sub(general, f"{{{LOM_NS}}}title")
    # A LOM langstring holds one <string language> per language, so 'all' lists every one.
    for lang, text in pieces(quiz.title, mode, quiz.source_lang):
        sub(title, f"{{{LOM_NS}}}string", text, language=lang)

    orgs = sub(root, f"{{{CC_NS}}}organizations")
    org = sub(orgs, f"{{{CC_NS}}}organization", identifier="org", structure="rooted-hierarchy")
    top = sub(org, f"{{{CC_NS}}}item", identifier="root")
    entry = sub(top, f"{{{CC_NS}}}item", identifier=f"{quiz.id}-item", identifierref=quiz.id)
    # Moodle names the restored quiz after this title and filters names through multilang
    # (when set to "content and headings"), so 'all' writes the same markup as the questions.
    ps = pieces(quiz.title, mode, quiz.source_lang)
    sub(entry, f"{{{CC_NS}}}title", html_inline(ps, style) if len(ps) > 1 else ps[0][1])

    res = sub(root, f"{{{CC_NS}}}resources")
    r = sub(res, f"{{{CC_NS}}}resource", identifier=quiz.id, type=ASSESSMENT_TYPE)
    sub(r, f"{{{CC_NS}}}file", href=qti_path(quiz))
    return root


def export(quiz: Quiz, mode: str, style: HtmlStyle) -> bytes:
    return zip_bytes(
        [
            ("imsmanifest.xml", xml_bytes(_manifest(quiz, mode, style))),
            (qti_path(quiz), xml_bytes(build_questestinterop(quiz, mode, style, "cc"))),
        ]
    )
