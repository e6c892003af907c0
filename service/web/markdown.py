"""Exercise statements: Markdown rendered on the server, code highlighted there (Pygments), and
math left as ``<span class="math">`` for KaTeX in the browser. Raw HTML in the Markdown is
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


def _math(content: str, options: dict[str, Any]) -> str:
    display = bool(options.get("display_mode"))
    cls = "math math-display" if display else "math math-inline"
    tag = "div" if display else "span"
    return f'<{tag} class="{cls}">{escape(content)}</{tag}>'


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
def render(text: str) -> str:
    return _md().render(text)
