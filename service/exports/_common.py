"""Helpers shared by every export format: deterministic zips, XML bytes, and per-language text.

Each format module decides *where* a string goes; this module decides *how* a string in one or
more languages becomes HTML, so the language rules of exports.md §5 live in one place.
"""

from __future__ import annotations

import hashlib
import html
import io
import zipfile
from collections.abc import Iterable
from typing import Literal

from lxml import etree

from item_bank.model import Item, Option, Quiz, Text

#: A zip entry's timestamp. Fixed so that the same bank always gives byte-identical packages;
#: 1980-01-01 is the earliest date the zip format can store.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
#: Regular file, rw-r--r--: importers never need anything else and umask must not leak in.
ZIP_FILE_MODE = 0o100644

XML_NS = "http://www.w3.org/XML/1998/namespace"
XML_LANG = f"{{{XML_NS}}}lang"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"

#: How a multi-language string is written into HTML:
#: ``tagged``: each language visibly, in its own element carrying ``lang`` (Canvas keeps lang).
#: ``spans``: Moodle's core multilang filter (adjacent ``<span lang class="multilang">``).
#: ``mlang``: the filter_multilang2 plugin syntax, English as ``{mlang other}``.
HtmlStyle = Literal["tagged", "spans", "mlang"]

Pieces = list[tuple[str, str]]


def zip_bytes(files: Iterable[tuple[str, bytes]]) -> bytes:
    """A zip of ``(name, data)`` in the order given, with fixed times and permissions."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, so external_attr is read as a mode everywhere
            info.external_attr = ZIP_FILE_MODE << 16
            zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    return buf.getvalue()


def xml_bytes(root: etree._Element) -> bytes:
    """UTF-8 XML with a declaration; pretty-printed so humans can diff two exports."""
    return etree.tostring(
        etree.ElementTree(root), xml_declaration=True, encoding="UTF-8", pretty_print=True
    )


def sub(parent: etree._Element, tag: str, text: str | None = None, **attrib: str) -> etree._Element:
    """``etree.SubElement`` that also sets the text, to keep the builders short."""
    el = etree.SubElement(parent, tag, attrib)
    if text is not None:
        el.text = text
    return el


def stable_int(*parts: str, lo: int = 1000, span: int = 9000) -> int:
    """A positive integer derived from ``parts`` alone (no counters, no randomness)."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return lo + int.from_bytes(digest[:8], "big") % span


def answer_idents(quiz: Quiz, item: Item) -> dict[str, int]:
    """Integer answer idents per option id, as Canvas itself writes them (exports.md §1).

    Derived from quiz, item and option ids rather than positions, so re-exporting after items
    are reordered or options added keeps every other ident, and thus Canvas's answer ids.
    Integers also keep 'correct'/'wrong'/'general_' out of the feedback idents built from them.
    """
    out: dict[str, int] = {}
    used: set[int] = set()
    for o in item.options:
        n = stable_int(quiz.id, item.id, o.id)
        while n in used:  # a collision inside one item: take the next free number, stably
            n = 1000 + (n - 1000 + 1) % 9000
        used.add(n)
        out[o.id] = n
    return out


def shuffles(quiz: Quiz, item: Item) -> bool:
    """Whether an LMS should shuffle ``item``'s options: the quiz asks for it and the item does
    not keep its written order (``shuffle: false``, e.g. "all of the above").

    Every format writes its own per-item flag from this one rule, as the API's per-attempt
    order (``service.core.views.option_order``) follows it.
    """
    return quiz.settings.shuffle_answers and item.shuffle


def pieces(t: Text, mode: str, source_lang: str) -> Pieces:
    """``(lang, text)`` pairs for a string in a language mode: one, or every language for 'all'."""
    if mode == "all":
        return list(t.variants(source_lang).items())
    return [t.render(mode, source_lang)]


def plain(t: Text, mode: str, source_lang: str) -> str:
    """Text for places that take no markup (titles, attributes): languages joined by ' / '."""
    return " / ".join(text for _, text in pieces(t, mode, source_lang))


def escape_html(text: str) -> str:
    """Text as HTML character data (``<``, ``>`` and ``&``), as lxml escapes element text."""
    return html.escape(text, quote=False)


def _inner_html(wrapper: etree._Element) -> str:
    """The serialised content of ``wrapper`` without the wrapper element itself."""
    # Leading text is not inside any child, so lxml would not escape it for us.
    out = [escape_html(wrapper.text or "")]
    out.extend(etree.tostring(child, method="html", encoding="unicode") for child in wrapper)
    return "".join(out)


def _lang_element(parent: etree._Element, tag: str, lang: str, text: str) -> etree._Element:
    return sub(parent, tag, text, lang=lang)


def _mlang_text(ps: Pieces) -> str:
    # filter_multilang2 has no English fallback, so English is the {mlang other} block (§4).
    blocks = [f"{{mlang {lang}}}{text}{{mlang}}" for lang, text in ps if lang != "en"]
    blocks += [f"{{mlang other}}{text}{{mlang}}" for lang, text in ps if lang == "en"]
    return "".join(blocks)


def html_block(ps: Pieces, style: HtmlStyle) -> str:
    """A paragraph-level string (question text, feedback) as an HTML fragment."""
    wrapper = etree.Element("div")
    if len(ps) == 1:
        ((lang, text),) = ps
        _lang_element(wrapper, "p", lang, text)
    elif style == "tagged":
        for lang, text in ps:
            _lang_element(wrapper, "p", lang, text)
    elif style == "spans":
        p = sub(wrapper, "p")
        for lang, text in ps:
            # attribute order lang, class and double quotes: the filter's regex wants exactly that
            sub(p, "span", text, lang=lang, **{"class": "multilang"})
    else:
        sub(wrapper, "p", _mlang_text(ps))
    if style == "tagged":
        return etree.tostring(wrapper, method="html", encoding="unicode")
    return _inner_html(wrapper)


def html_inline(ps: Pieces, style: HtmlStyle) -> str:
    """A phrase-level string (an answer) as an HTML fragment without block elements."""
    wrapper = etree.Element("div")
    if len(ps) == 1:
        ((lang, text),) = ps
        _lang_element(wrapper, "span", lang, text)
    elif style == "tagged":
        for i, (lang, text) in enumerate(ps):
            if i:
                etree.SubElement(wrapper, "br")
            _lang_element(wrapper, "span", lang, text)
    elif style == "spans":
        for lang, text in ps:
            sub(wrapper, "span", text, lang=lang, **{"class": "multilang"})
    else:
        wrapper.text = _mlang_text(ps)
    return _inner_html(wrapper)


def true_false_value(item: Item, o: Option) -> bool:
    """Whether a true_false option means 'true'. Moodle needs to know (§3, §4).

    Read from the English text; if neither option says True/False there, the first option is
    taken as 'true', which is the order Moodle itself assumes for old files.
    """
    words = [x.text.en.strip().lower().rstrip(".") for x in item.options]
    if "true" in words and "false" in words:
        return o.text.en.strip().lower().rstrip(".") == "true"
    return item.options[0].id == o.id


def format_points(points: float) -> str:
    """Points without a spurious '.0' (Canvas and Moodle both read plain decimals)."""
    return f"{points:g}"
