"""HTML from an LMS file → the language versions of one string.

The exporters write a string in several languages as ``<p lang>`` blocks (Canvas), Moodle
multilang spans or ``{mlang xx}…{mlang}`` blocks (``service/exports/_common.py``); Moodle's own
files use the same two Moodle syntaxes. Reading is one rule for all of them: for each language
present, drop what is tagged with another language and keep the rest, which is exactly what
Moodle's filters show a reader of that language.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import lxml.html
from lxml import etree

#: (language or None when the file does not say, text)
Pieces = list[tuple[str | None, str]]

_MLANG = re.compile(r"\{mlang\s+([^}]*)\}(.*?)\{mlang\}", re.S | re.I)
_BLOCK = {
    "p", "div", "li", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6",
    "blockquote", "pre", "table", "tr", "section", "article",
}  # fmt: skip
#: Markup that carries nothing beyond its text; anything else is reported as reduced.
_NEUTRAL = {"p", "div", "span", "br", "body", "prompt", "simplechoice", "modalfeedback", "itembody"}
_SPACE_RUN = re.compile(r"[ \t]*[\r\n\t][ \t\r\n]*")
_PARA = "\x00"  # paragraph boundary while extracting, turned into a blank line at the end
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"


@dataclass
class Reading:
    pieces: Pieces
    reduced: set[str] = field(default_factory=set)  # tags whose formatting was dropped


def norm_lang(code: str) -> str:
    """'EN_us' → 'en'; Moodle lower-cases and uses '_', HTML uses '-'."""
    return code.strip().lower().replace("_", "-").split("-")[0]


def _lang_of(el: etree._Element) -> str | None:
    value = el.get("lang") or el.get(XML_LANG)
    return norm_lang(value) if value else None


def _outer_lang_elements(root: etree._Element) -> list[etree._Element]:
    out = []
    for el in root.iter():
        if el is root or not isinstance(el.tag, str) or _lang_of(el) is None:
            continue
        if any(_lang_of(a) is not None for a in el.iterancestors() if a is not root):
            continue
        out.append(el)
    return out


def _extract(el: etree._Element, out: list[str], reduced: set[str]) -> None:
    tag = el.tag if isinstance(el.tag, str) else ""
    tag = tag.rsplit("}", 1)[-1].lower()
    if tag and tag not in _NEUTRAL:
        reduced.add(tag)
    block = tag in _BLOCK
    if block:
        out.append(_PARA)
    if tag == "br":
        out.append("\n")
    if el.text:
        out.append(el.text)
    for c in el:
        _extract(c, out, reduced)
        if c.tail:
            out.append(c.tail)
    if block:
        out.append(_PARA)


def _finish(parts: list[str]) -> str:
    raw = "".join(parts)
    chunks = [_SPACE_RUN.sub(" ", c).strip() for c in raw.split(_PARA)]
    return "\n\n".join(c for c in chunks if c)


def _mlang_langs(text: str) -> list[str]:
    out: list[str] = []
    for m in _MLANG.finditer(text):
        out += [norm_lang(x) if x.strip().lower() != "other" else "other" for x in m[1].split(",")]
    return out


def _mlang_keep(text: str, lang: str) -> str:
    def repl(m: re.Match[str]) -> str:
        langs = {norm_lang(x) if x.strip().lower() != "other" else "other" for x in m[1].split(",")}
        return m[2] if lang in langs else ""

    return _MLANG.sub(repl, text)


def _fragment(html: str) -> etree._Element:
    try:
        return lxml.html.fragment_fromstring(html, create_parent="div")
    except (etree.ParserError, ValueError):
        wrapper = lxml.html.Element("div")
        wrapper.text = html
        return wrapper


def read_element(root: etree._Element) -> Reading:
    """Language versions of an element's content (HTML or QTI XHTML)."""
    reduced: set[str] = set()
    lang_els = _outer_lang_elements(root)
    probe: list[str] = []
    _extract(root, probe, set())
    whole = "".join(probe)
    langs = list(dict.fromkeys([_lang_of(e) or "" for e in lang_els] + _mlang_langs(whole)))
    if not langs:
        parts: list[str] = []
        _extract(root, parts, reduced)
        return Reading([(None, _finish(parts))], reduced)
    pieces: Pieces = []
    for lang in langs:
        tree = copy.deepcopy(root)
        for el in _outer_lang_elements(tree):
            if _lang_of(el) != lang:
                _drop(el)
        parts = []
        _extract(tree, parts, reduced)
        text = _finish([_mlang_keep("".join(parts), lang)])
        if text:
            pieces.append((lang, text))  # 'other' ({mlang other}) is resolved by the builder
    reduced.discard("")
    return Reading(pieces, reduced)


def _drop(el: etree._Element) -> None:
    """Remove ``el`` but keep the text that follows it."""
    parent = el.getparent()
    if parent is None:
        return
    if el.tail:
        prev = el.getprevious()
        if prev is not None:
            prev.tail = (prev.tail or "") + el.tail
        else:
            parent.text = (parent.text or "") + el.tail
    parent.remove(el)


def read_html(html: str | None, *, is_html: bool = True) -> Reading:
    """Language versions of an HTML (or plain) string from a file."""
    if html is None or not html.strip():
        return Reading([])
    if not is_html:
        root = lxml.html.Element("div")
        root.text = html
        return read_element(root)
    return read_element(_fragment(html))


def read_plain(text: str | None) -> Reading:
    return read_html(text, is_html=False)
