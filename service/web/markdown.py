"""Exercise statements: Markdown rendered on the server, code highlighted there (Pygments), and
math left as ``<span class="math inline">`` / ``<div class="math block">`` for KaTeX in the browser. Raw HTML in the Markdown is
escaped, not passed through."""

from __future__ import annotations

from functools import lru_cache
from html import escape
from typing import Any

from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

_FORMATTER = HtmlFormatter(nowrap=True)


def _highlight(code: str, lang: str, _attrs: str) -> str:
    try:
        lexer = get_lexer_by_name(lang or "text")
    except ClassNotFound:
        return escape(code)
    return highlight(code, lexer, _FORMATTER)


def _math(content: str, _options: dict[str, Any]) -> str:
    # The plugin wraps this in <span class="math inline"> or <div class="math block">.
    return escape(content)


@lru_cache(maxsize=1)
def _md() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "highlight": _highlight}).enable("table")
    md.use(
        dollarmath_plugin,
        allow_space=True,
        # "$5" in prose is money, not math.
        allow_digits=False,
        double_inline=True,
        renderer=_math,
    )
    return md


@lru_cache(maxsize=64)
def render(text: str, *, drop_title: bool = False) -> str:
    """HTML of ``text``; ``drop_title`` leaves out a leading ``# Title`` (the page shows it)."""
    if drop_title and text.lstrip().startswith("# "):
        text = text.lstrip().split("\n", 1)[1] if "\n" in text.lstrip() else ""
    html = _md().render(text)
    # Code and display math may scroll sideways: keyboard users must be able to reach them.
    return html.replace("<pre>", '<pre tabindex="0">').replace(
        '<div class="math block">', '<div class="math block" tabindex="0">'
    )
