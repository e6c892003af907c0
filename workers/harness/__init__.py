"""The shared grading harness: ``grade()`` runs one job (checker + sandboxed runner)."""

from __future__ import annotations

from workers.harness.parent import grade, harness_hash
from workers.results import GradeResult

__all__ = ["GradeResult", "grade", "harness_hash"]
