"""LMS imports: a Moodle XML file, Canvas QTI 1.2 zip, QTI 2.1 package or Common Cartridge →
one quiz in the item bank's schema, with a warning for everything the bank could not take.

``import_quiz`` is the single entry point; the CLI (``kgrade import``) and the REST API
(``POST /api/v1/quizzes/import``) both call it. Formats are recognised by content, not by file
name. Each format has its own module; ``_build`` turns what they read into a validated ``Quiz``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lxml import etree

from item_bank.model import Quiz
from service.imports import moodle_xml, qti12, qti21
from service.imports._build import DraftQuiz, build
from service.imports._safe import (
    MAX_FILE_BYTES,
    ImportFailed,
    Package,
    child,
    children,
    descendants,
    local,
    open_zip,
    parse_xml,
)

#: Names as the results and docs give them.
FORMAT_NAMES = ("moodle-xml", "qti12", "imscc", "qti21")
CC_ASSESSMENT = "imsqti_xmlv1p2/imscc_xmlv1p1/assessment"


@dataclass
class ImportResult:
    quiz: Quiz
    format: str  # one of FORMAT_NAMES
    warnings: list[str] = field(default_factory=list)


def _resources(manifest: etree._Element) -> list[etree._Element]:
    return [r for r in descendants(manifest, "resource")]


def _first_file(res: etree._Element) -> str | None:
    f = child(res, "file")
    return (f.get("href") if f is not None else None) or res.get("href")


def _read_cc(pkg: Package, manifest: etree._Element) -> DraftQuiz:
    quizzes = [r for r in _resources(manifest) if r.get("type") == CC_ASSESSMENT]
    if not quizzes:
        raise ImportFailed(
            "this Common Cartridge holds no QTI assessment "
            f"(resource type {CC_ASSESSMENT!r}); nothing to import"
        )
    href = _first_file(quizzes[0])
    if not href:
        raise ImportFailed("the cartridge's assessment resource names no file")
    draft = qti12.read_questestinterop(pkg.xml(href), "Common Cartridge")
    if len(quizzes) > 1:
        draft.warnings.append(f"{len(quizzes)} assessments in the cartridge; the first is imported")
    # The LOM title holds one <string language> per language: better than the plain title.
    lom_title = next((t for t in descendants(manifest, "title") if children(t, "string")), None)
    if lom_title is not None:
        strings = [
            (s.get("language"), (s.text or "").strip()) for s in children(lom_title, "string")
        ]
        pieces = [(lang.split("-")[0].lower() if lang else None, t) for lang, t in strings if t]
        if pieces:
            draft.title = pieces
    draft.warnings.append(
        "Common Cartridge does not carry the quiz description, answer shuffling, the scoring "
        "policy or re-answering; the bank's defaults apply"
    )
    return draft


def _read_canvas(pkg: Package, manifest: etree._Element) -> DraftQuiz:
    quizzes = [r for r in _resources(manifest) if r.get("type") == "imsqti_xmlv1p2"]
    href = _first_file(quizzes[0])
    if not href:
        raise ImportFailed("the package's QTI resource names no file")
    draft = qti12.read_questestinterop(pkg.xml(href), "Canvas QTI 1.2")
    if len(quizzes) > 1:
        draft.warnings.append(f"{len(quizzes)} quizzes in the package; the first is imported")
    base = href.rsplit("/", 1)[0] if "/" in href else ""
    meta_path = f"{base}/assessment_meta.xml" if base else "assessment_meta.xml"
    if pkg.has(meta_path):
        qti12.read_canvas_meta(draft, pkg.xml(meta_path))
    else:
        draft.warnings.append("no assessment_meta.xml: quiz settings are the bank's defaults")
    return draft


def _read_zip(data: bytes) -> tuple[str, DraftQuiz]:
    pkg = open_zip(data)
    if pkg.has("moodle_backup.xml"):
        raise ImportFailed(
            "a Moodle backup (.mbz) is not read here: restore it in Moodle, or export the "
            "questions from Moodle's question bank as Moodle XML and import that"
        )
    if not pkg.has("imsmanifest.xml"):
        # A zip of loose QTI files (some tools export those): take the first one we know.
        for name in sorted(pkg.names):
            if name.endswith(".xml"):
                root = pkg.xml(name)
                if local(root) == "questestinterop":
                    return "qti12", qti12.read_questestinterop(root, "QTI 1.2")
        if any(n.endswith(".xml") for n in pkg.names):
            return "qti21", qti21.read_package(pkg, None)
        raise ImportFailed("the zip has no imsmanifest.xml and no QTI file")
    manifest = pkg.xml("imsmanifest.xml")
    types = {r.get("type") or "" for r in _resources(manifest)}
    # Canvas's own zips use the CC manifest namespace too; only a CC assessment (or no Canvas
    # QTI resource at all) makes a cartridge.
    cc_manifest = "imscc" in (etree.QName(manifest).namespace or "") or any(
        "imscc" in t for t in types
    )
    if cc_manifest and (CC_ASSESSMENT in types or "imsqti_xmlv1p2" not in types):
        return "imscc", _read_cc(pkg, manifest)
    if "imsqti_xmlv1p2" in types:
        return "qti12", _read_canvas(pkg, manifest)
    if any(t.startswith(("imsqti_test_xmlv2p", "imsqti_item_xmlv2p")) for t in types):
        return "qti21", qti21.read_package(pkg, manifest)
    raise ImportFailed(
        "the package's manifest lists no quiz resource this importer knows "
        f"(types: {', '.join(sorted(t for t in types if t)) or 'none'})"
    )


def read_draft(data: bytes, filename: str) -> tuple[str, DraftQuiz]:
    """(format, draft) for a file's bytes; the format is sniffed from the content."""
    if not data:
        raise ImportFailed("the file is empty")
    if len(data) > MAX_FILE_BYTES:
        raise ImportFailed(f"the file is larger than {MAX_FILE_BYTES // 2**20} MiB")
    if data[:4] == b"PK\x03\x04" or data[:4] == b"PK\x05\x06":
        return _read_zip(data)
    if data[:2] == b"\x1f\x8b":
        raise ImportFailed(
            "a gzip file (a Moodle .mbz backup?) is not read here: restore it in Moodle, or "
            "export the questions from Moodle's question bank as Moodle XML and import that"
        )
    head = data[:512].lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head.startswith(b"<"):
        raise ImportFailed(
            "unknown format: expected Moodle XML, or a zip (Canvas QTI 1.2, QTI 2.1, "
            "Common Cartridge)"
        )
    root = parse_xml(data, filename)
    name = local(root)
    if name == "quiz":
        return "moodle-xml", moodle_xml.read(root)
    if name == "questestinterop":
        return "qti12", qti12.read_questestinterop(root, "QTI 1.2")
    if name == "assessmentItem":
        draft = qti21.read_items([(filename, root)], "QTI 2.1")
        draft.title = [(None, root.get("title") or "")] if root.get("title") else []
        return "qti21", draft
    raise ImportFailed(
        f"unknown format: an XML file whose root is <{name}> (expected <quiz> for Moodle XML, "
        "<questestinterop> or <assessmentItem>)"
    )


def import_quiz(
    data: bytes, filename: str = "upload", *, quiz_id: str | None = None
) -> ImportResult:
    """The quiz in ``data``; raises ``ImportFailed`` (with ``field``) when it cannot be read."""
    try:
        fmt, draft = read_draft(data, filename)
        quiz = build(draft, quiz_id=quiz_id, source=filename)
    except ImportFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - untrusted bytes meet parsers here: never a 500
        raise ImportFailed(
            f"{filename}: cannot be read ({type(exc).__name__}: {str(exc)[:200]})"
        ) from exc
    return ImportResult(quiz, fmt, list(dict.fromkeys(draft.warnings)))


__all__ = ["FORMAT_NAMES", "ImportFailed", "ImportResult", "import_quiz", "read_draft"]
