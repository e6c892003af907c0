"""results.json: the union of Gradescope and PrairieLearn result files (grader spec §10).

The builder lives in :class:`GradeResult`; :func:`validate_results` is the gate every result passes
before it is stored or printed (also by the later Celery layer), so a malformed or oversized
result can never reach the LMS. Extra grader data (timings, hardware, isolation) sits under the
``kgrade`` key, which both LMS formats ignore.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from workers.verdicts import VERDICTS, Verdict

MAX_RESULTS_BYTES = 1_000_000  # spec: reject results over 1 MB
MAX_OUTPUT_CHARS = 16_000  # spec §7: display <= 16 KB
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")


def cap_text(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    """Trim student-facing text; the marker says how much was dropped so nothing hides silently."""
    if len(text) <= limit:
        return text
    return text[: limit - 60] + f"\n[... {len(text) - limit + 60} characters truncated]"


@dataclass
class TestResult:
    __test__ = False  # not a pytest class
    name: str
    max_points: float
    passed: bool
    output: str = ""
    visibility: str = "visible"
    verdict: str = Verdict.PASS.value
    points: float | None = None  # None: max_points when passed, else 0

    def to_json(self) -> dict[str, Any]:
        points = (
            self.points if self.points is not None else (self.max_points if self.passed else 0.0)
        )
        hidden = self.visibility == "hidden"
        return {
            "name": self.name,
            "points": round(float(points), 6),
            "max_points": round(float(self.max_points), 6),
            # Gradescope reads score/max_score; PrairieLearn reads points/max_points.
            "score": round(float(points), 6),
            "max_score": round(float(self.max_points), 6),
            "status": "passed" if self.passed else "failed",
            # Hidden tests show pass/fail only: no message that could leak the hidden case.
            "output": "" if hidden else cap_text(self.output, 2000),
            "visibility": self.visibility,
        }


@dataclass
class ShapeTiming:
    name: str
    shape: dict[str, Any]
    n: int
    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    floor_ms: float
    ref_median_ms: float | None = None
    speedup: float | None = None  # clamped t_ref / t_sub
    # GPU runs only (a CPU rehearsal's times say nothing about a GPU): the median call's
    # position against the H200's roofline, per GPU, workers.harness.roofline.position():
    # tflops, tbytes_s, flops_frac, bytes_frac, bound ("compute"/"memory"), peak_frac
    roofline: dict[str, Any] | None = None


@dataclass
class GradeResult:
    exercise: str
    verdict: Verdict
    score: float
    tests: list[TestResult] = field(default_factory=list)
    output: str = ""
    device: str = "cpu"
    isolation: str = "none"
    timings: list[ShapeTiming] = field(default_factory=list)
    speedup: float | None = None  # geometric mean over hidden benchmark shapes
    # GPU runs only: the geometric mean of the shapes' roofline fractions, with the peaks
    # (workers.harness.roofline.summary()); student-facing, beside the speedup
    roofline: dict[str, Any] | None = None
    hardware: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    harness_hash: str = ""
    run_id: str = ""
    elapsed_s: float = 0.0
    logs: str = ""  # capped runner stdout/stderr, staff-facing
    details: dict[str, Any] = field(default_factory=dict)  # staff-facing diagnostics

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.PASS

    def to_results_json(self) -> dict[str, Any]:
        score = min(1.0, max(0.0, float(self.score))) if math.isfinite(self.score) else 0.0
        leaderboard = []
        if self.speedup is not None and self.verdict is Verdict.PASS:
            leaderboard.append(
                {"name": "speedup", "value": round(self.speedup, 4), "order": "desc"}
            )
        doc = {
            "score": round(score, 6),
            "gradable": self.verdict.gradable,
            "verdict": self.verdict.value,
            "output": cap_text(self.output),
            "tests": [t.to_json() for t in self.tests],
            "leaderboard": leaderboard,
            "kgrade": {
                "exercise": self.exercise,
                "device": self.device,
                "isolation": self.isolation,
                "speedup": self.speedup,
                "roofline": self.roofline,
                "timings": [asdict(t) for t in self.timings],
                "hardware": self.hardware,
                "versions": self.versions,
                "harness_hash": self.harness_hash,
                "run_id": self.run_id,
                "elapsed_s": round(self.elapsed_s, 3),
                "logs": cap_text(self.logs),
                "details": self.details,
            },
        }
        validate_results(doc)
        return doc


class ResultsError(ValueError):
    pass


def validate_results(doc: dict[str, Any]) -> None:
    """Raise ResultsError unless ``doc`` is a well-formed results.json of at most 1 MB."""

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ResultsError(msg)

    need(isinstance(doc, dict), "results must be an object")
    for key in ("score", "gradable", "verdict", "output", "tests", "leaderboard"):
        need(key in doc, f"results lack {key!r}")
    score = doc["score"]
    need(isinstance(score, int | float) and not isinstance(score, bool), "score must be a number")
    need(math.isfinite(score) and 0.0 <= score <= 1.0, "score must lie in [0, 1]")
    need(doc["verdict"] in VERDICTS, f"unknown verdict {doc['verdict']!r}")
    need(isinstance(doc["gradable"], bool), "gradable must be a bool")
    need(
        doc["gradable"] == (doc["verdict"] != "INFRA_ERROR"),
        "gradable is false only for INFRA_ERROR",
    )
    need(doc["verdict"] == "PASS" or score == 0.0, "a failing verdict scores 0 (grading is gated)")
    need(isinstance(doc["output"], str), "output must be a string")
    need(isinstance(doc["tests"], list), "tests must be a list")
    for t in doc["tests"]:
        need(isinstance(t, dict), "each test must be an object")
        need(isinstance(t.get("name"), str) and t["name"], "test name must be a non-empty string")
        for k in ("points", "max_points"):
            v = t.get(k)
            need(
                isinstance(v, int | float) and not isinstance(v, bool), f"test {k} must be a number"
            )
            need(math.isfinite(v) and v >= 0, f"test {k} must be finite and >= 0")
        need(t["points"] <= t["max_points"] + 1e-9, "test points exceed max_points")
        need(t.get("status") in ("passed", "failed"), "test status must be passed/failed")
        need(t.get("visibility") in VISIBILITIES, f"bad visibility {t.get('visibility')!r}")
        need(isinstance(t.get("output", ""), str), "test output must be a string")
    need(isinstance(doc["leaderboard"], list), "leaderboard must be a list")
    for e in doc["leaderboard"]:
        need(
            isinstance(e, dict) and isinstance(e.get("name"), str), "leaderboard entry needs a name"
        )
        need(isinstance(e.get("value"), int | float), "leaderboard value must be a number")
        need(e.get("order") in ("asc", "desc"), "leaderboard order must be asc/desc")
    size = len(json.dumps(doc, allow_nan=False).encode())  # also rejects NaN/Inf anywhere
    need(size <= MAX_RESULTS_BYTES, f"results are {size} bytes, over the 1 MB limit")
