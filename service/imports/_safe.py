"""Reading untrusted uploads: XML without entity tricks, zips without bombs.

Every import goes through these two doors, so the limits live in one place. The errors are
``ImportFailed`` naming the field (``file``) with a sentence an instructor can act on.
"""

from __future__ import annotations

import io
import posixpath
import zipfile
from dataclasses import dataclass

from lxml import etree

#: Largest upload we read at all (the API's own body limit is usually smaller).
MAX_FILE_BYTES = 32 * 1024 * 1024
#: A package's members, unpacked: a quiz is text, so this is generous.
MAX_MEMBER_BYTES = 16 * 1024 * 1024
MAX_TOTAL_BYTES = 64 * 1024 * 1024
MAX_MEMBERS = 5000
#: Deflate cannot honestly do much better than ~1000:1; a higher claimed ratio is a bomb.
MAX_RATIO = 200


class ImportFailed(ValueError):
    """The file cannot be imported; ``field`` names the input at fault (``file``, ``quiz_id``)."""

    def __init__(
        self,
        message: str,
        *,
        field: str = "file",
        status: int = 422,
        warnings: list[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.field = field
        self.status = status
        self.warnings = warnings or []


def _parser() -> etree.XMLParser:
    # No DTD loading, no entity substitution, no network: XXE and entity expansion are off.
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
    )


def parse_xml(data: bytes, what: str) -> etree._Element:
    """The root element of ``data``; ``what`` names the file in errors."""
    try:
        root = etree.fromstring(data, _parser())
    except etree.XMLSyntaxError as exc:
        raise ImportFailed(f"{what}: not well-formed XML ({exc.msg})") from None
    if root is None:
        raise ImportFailed(f"{what}: empty XML document")
    dtd = root.getroottree().docinfo.internalDTD
    if dtd is not None and any(True for _ in dtd.iterentities()):
        # Unexpanded entities would silently lose text; refusing says why.
        raise ImportFailed(f"{what}: declares XML entities (<!ENTITY>), which are not accepted")
    return root


def local(el: etree._Element) -> str:
    """An element's tag without its namespace ('' for comments and the like)."""
    tag = el.tag
    if not isinstance(tag, str):
        return ""
    return tag.rsplit("}", 1)[-1]


def children(el: etree._Element, name: str) -> list[etree._Element]:
    return [c for c in el if local(c) == name]


def child(el: etree._Element | None, name: str) -> etree._Element | None:
    if el is None:
        return None
    for c in el:
        if local(c) == name:
            return c
    return None


def descendants(el: etree._Element, name: str) -> list[etree._Element]:
    return [d for d in el.iter() if local(d) == name]


def child_text(el: etree._Element | None, *path: str) -> str | None:
    for name in path:
        el = child(el, name)
    if el is None:
        return None
    return el.text if el.text is not None else ""


@dataclass
class Package:
    """A zip's members by normalised path, read lazily with size checks."""

    zf: zipfile.ZipFile
    names: dict[str, zipfile.ZipInfo]

    def has(self, path: str) -> bool:
        return norm_path(path) in self.names

    def read(self, path: str) -> bytes:
        info = self.names.get(norm_path(path))
        if info is None:
            raise ImportFailed(f"the package lists {path!r}, but it is not in the zip")
        with self.zf.open(info) as fh:
            data = fh.read(MAX_MEMBER_BYTES + 1)
        if len(data) > MAX_MEMBER_BYTES:
            raise ImportFailed(f"{path}: larger than {MAX_MEMBER_BYTES // 2**20} MiB unpacked")
        return data

    def xml(self, path: str) -> etree._Element:
        return parse_xml(self.read(path), path)


def norm_path(path: str) -> str:
    return posixpath.normpath(path.replace("\\", "/")).lstrip("/")


def open_zip(data: bytes) -> Package:
    """A zip checked against bombs: member count, sizes and compression ratio."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError) as exc:
        raise ImportFailed(f"not a readable zip file ({exc})") from None
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise ImportFailed(f"the zip has {len(infos)} members; at most {MAX_MEMBERS} are read")
    total = 0
    names: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        if info.is_dir():
            continue
        total += info.file_size
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size > MAX_MEMBER_BYTES or (info.file_size > 1_000_000 and ratio > MAX_RATIO):
            raise ImportFailed(f"{info.filename}: too large unpacked ({info.file_size} bytes)")
        names[norm_path(info.filename)] = info
    if total > MAX_TOTAL_BYTES:
        raise ImportFailed(f"the zip unpacks to {total} bytes; at most {MAX_TOTAL_BYTES}")
    return Package(zf, names)


def resolve(base: str, href: str) -> str:
    """``href`` relative to the file ``base`` inside a package."""
    return norm_path(posixpath.join(posixpath.dirname(base), href.split("#", 1)[0]))
