"""How a job ends with a verdict: ``Failure``, raised anywhere inside a job (the default verdict
is failure: a job passes only if every phase reports success), and the verdict of an exception
the runner reported from the submission's code."""

from __future__ import annotations

from typing import Any

from workers.verdicts import Verdict


class Failure(Exception):
    """Ends grading with a verdict (raised anywhere inside a job)."""

    def __init__(self, verdict: Verdict, message: str) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.message = message


def error_verdict(err: dict[str, Any]) -> Verdict:
    """RESOURCE_LIMIT for exhaustion (memory, processes, files, disk), else RUNTIME_ERROR."""
    return Verdict.RESOURCE_LIMIT if err.get("kind") == "resource" else Verdict.RUNTIME_ERROR


def fmt_err(err: dict[str, Any]) -> str:
    """A runner's error report (``sandboxed/channel.py:error_report``) for the student."""
    return f"{err.get('type', 'Error')}: {err.get('msg', '')}\n{err.get('tb', '')}"
