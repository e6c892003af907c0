"""The submission's import inside the runner, under the exercise's import denylist.

A denied import raises ImportError and is remembered, so a ``try``/``except`` fallback still
loses (the parent turns any attempt into POLICY_VIOLATION); modules that were already loaded
and show up among the new ones count too.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from .channel import error_report


class DenyFinder(importlib.abc.MetaPathFinder):
    """Refuses forbidden modules and remembers the attempt (a try/except fallback still loses)."""

    def __init__(self, denied: list[str]) -> None:
        self.denied = denied
        self.hits: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        for d in self.denied:
            if fullname == d or fullname.startswith(d + "."):
                self.hits.append(fullname)
                raise ImportError(f"import of {fullname!r} is not allowed in this exercise")
        return None


class ImportPart:
    """``Rank``'s import phase: sets ``fn``, the submission's entry function."""

    fn: Callable[..., Any] | None
    finder: DenyFinder | None

    def do_import(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.finder = DenyFinder(list(msg.get("deny", [])))
        sys.meta_path.insert(0, self.finder)
        if msg.get("path_extra"):  # trusted reference runs only: make ``kernels`` importable
            sys.path.insert(0, msg["path_extra"])
        before = set(sys.modules)
        path = msg["path"]
        try:
            spec = importlib.util.spec_from_file_location("submission", path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules["submission"] = mod
            spec.loader.exec_module(mod)
            fn = getattr(mod, msg["entry"], None)
            if not callable(fn):
                return {
                    "t": "imported",
                    "ok": False,
                    "hits": self.finder.hits,
                    "error": {
                        "type": "AttributeError",
                        "msg": f"the submission defines no function {msg['entry']!r}",
                    },
                }
            self.fn = fn
        except BaseException as e:  # noqa: BLE001 - anything the student raises is reported
            return {
                "t": "imported",
                "ok": False,
                "hits": self.finder.hits,
                "error": error_report(e),
            }
        new = sorted(set(sys.modules) - before)
        deny = msg.get("deny", [])  # the parent's list, not the finder's copy
        denied = [m for m in new for d in deny if m == d or m.startswith(d + ".")]
        return {"t": "imported", "ok": True, "hits": self.finder.hits + denied}
