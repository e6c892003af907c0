"""The grading verdicts (grader spec §9).

Default is failure: a job is PASS only when every phase reported and every check passed. When
several checks fail, the first one in grading order decides (import, then per call: runtime,
type, mutation, value), so a verdict is reproducible for a given submission and seed.
"""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    PASS = "PASS"
    WRONG_ANSWER = "WRONG_ANSWER"
    TYPE_VIOLATION = "TYPE_VIOLATION"
    INPUT_MUTATED = "INPUT_MUTATED"
    POLICY_VIOLATION = "POLICY_VIOLATION"
    INTEGRITY_VIOLATION = "INTEGRITY_VIOLATION"
    TIMEOUT = "TIMEOUT"
    RESOURCE_LIMIT = "RESOURCE_LIMIT"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    INFRA_ERROR = "INFRA_ERROR"

    @property
    def gradable(self) -> bool:
        # INFRA_ERROR is not the student's fault: no grade is recorded (results.json gradable=false).
        return self is not Verdict.INFRA_ERROR

    @property
    def charged(self) -> bool:
        """Whether the verdict counts against the student (everything but infrastructure)."""
        return self.gradable


VERDICTS: tuple[str, ...] = tuple(v.value for v in Verdict)
