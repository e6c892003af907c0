"""The shared grading harness: ``grade()`` runs one job (checker + sandboxed runner);
``grade_ranked()`` adds the confirmation run a ranked score needs."""

from __future__ import annotations

from workers.harness.parent import grade, grade_ranked, harness_hash
from workers.results import GradeResult

__all__ = ["GradeResult", "grade", "grade_ranked", "harness_hash"]
