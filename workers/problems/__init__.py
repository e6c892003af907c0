"""Checker-side problem definitions: case generation, fp64 gold and checks, one module per kind.

Imported only by the trusted checker process (and tests); never by the sandboxed runner, and
never together with student code. Gold values are plain fp64 torch written here, independent of
the reference kernels being graded against.
"""

from __future__ import annotations

import importlib
from types import ModuleType

KINDS = ("merge", "block", "ring", "nsa", "nsa_bwd")


def load_problem(kind: str) -> ModuleType:
    if kind not in KINDS:
        raise ValueError(f"unknown problem kind {kind!r}; known: {KINDS}")
    return importlib.import_module(f"workers.problems.{kind}")
