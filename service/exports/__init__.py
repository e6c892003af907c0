"""LMS exports: one quiz from the item bank as a file Canvas or Moodle imports as is.

``export_quiz`` is the single entry point; the CLI (``kgrade export``) and the REST API both call
it, so both hand out the same bytes. Formats and their importer rules: shared/specs/exports.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from item_bank.model import Quiz
from service.exports import imscc, mbz, moodle_xml, qti12, qti21

#: format → (media type, file extension)
FORMATS: dict[str, tuple[str, str]] = {
    "qti12": ("application/zip", ".zip"),
    "qti21": ("application/zip", ".zip"),
    "imscc": ("application/vnd.ims.imsccv1p1", ".imscc"),
    "moodle-xml": ("application/xml", ".xml"),
    # A Moodle 2 backup; Moodle's own mimetype for .mbz (lib/classes/filetypes.php).
    "moodle-mbz": ("application/vnd.moodle.backup", ".mbz"),
}

#: en: English everywhere; source: each string's source form; all: every language (§5).
LANG_MODES: tuple[str, ...] = ("en", "source", "all")

#: How Moodle targets write several languages: core multilang spans or {mlang} (filter_multilang2).
MLANG_SYNTAXES: tuple[str, ...] = ("spans", "mlang")

MOODLE_FORMATS = ("imscc", "moodle-xml", "moodle-mbz")


@dataclass(frozen=True)
class ExportFile:
    data: bytes
    filename: str
    media_type: str


def export_filename(quiz_id: str, fmt: str, lang: str, mlang: str = "spans") -> str:
    """``<quiz>-<format>-<lang>[-mlang]<ext>``: distinct for every distinct output."""
    tail = "-mlang" if mlang == "mlang" and lang == "all" and fmt in MOODLE_FORMATS else ""
    return f"{quiz_id}-{fmt}-{lang}{tail}{FORMATS[fmt][1]}"


def export_quiz(quiz: Quiz, fmt: str, lang: str = "en", *, mlang: str = "spans") -> ExportFile:
    """Export ``quiz`` as ``fmt`` in language mode ``lang``.

    ``mlang`` only changes Moodle targets with ``lang='all'``. Unknown values raise
    ``ValueError`` with a one-line reason.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    if lang not in LANG_MODES:
        raise ValueError(f"unknown language mode {lang!r}; use one of {', '.join(LANG_MODES)}")
    if mlang not in MLANG_SYNTAXES:
        raise ValueError(f"unknown mlang syntax {mlang!r}; use one of {', '.join(MLANG_SYNTAXES)}")
    style: qti12.HtmlStyle = "mlang" if mlang == "mlang" else "spans"
    if fmt == "qti12":
        data = qti12.export(quiz, lang)
    elif fmt == "qti21":
        data = qti21.export(quiz, lang)
    elif fmt == "imscc":
        data = imscc.export(quiz, lang, style)
    elif fmt == "moodle-mbz":
        data = mbz.export(quiz, lang, style)
    else:
        data = moodle_xml.export(quiz, lang, style)
    return ExportFile(data, export_filename(quiz.id, fmt, lang, mlang), FORMATS[fmt][0])


__all__ = [
    "FORMATS",
    "LANG_MODES",
    "MLANG_SYNTAXES",
    "ExportFile",
    "export_filename",
    "export_quiz",
]
