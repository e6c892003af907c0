"""Scoring a graded job (grader spec §6): points per test, the speedup's points, the total, and
the confirmation run a ranked score needs. The student-facing benchmark line carries the speedup
and, on a GPU, the kernel's roofline position (``roofline.py``) beside it.
"""

from __future__ import annotations

from workers.exercises import Exercise
from workers.harness import roofline
from workers.results import GradeResult, TestResult


def benchmark_line(res: GradeResult) -> str:
    """``speedup 1.234x`` and, where there is one (GPU runs), the roofline position:
    ``speedup 1.234x; 23 % of the H200 roofline (geomean over shapes)``."""
    line = f"speedup {res.speedup:.3f}x"
    if res.roofline:
        line += "; " + roofline.summary_text(res.roofline)
    return line


def score(ex: Exercise, res: GradeResult, tests: list[TestResult]) -> None:
    """Points per test and the total: correctness shares ``correctness_weight`` equally over the
    tests when the run was timed (all of it when not), the speedup earns up to ``speed_weight``
    on a ``benchmark`` line, and a failing verdict scores 0 (grader spec §6)."""
    sc = ex.scoring
    timed = res.speedup is not None
    cw = float(sc["correctness_weight"]) if timed else 1.0
    n = max(1, len(tests))
    for t in tests:
        t.max_points = cw / n
    if timed:
        tests.append(
            TestResult(
                "benchmark",
                float(sc["speed_weight"]),
                res.passed,
                benchmark_line(res),
                "visible",
                res.verdict.value,
                points=speed_points(ex, res.speedup) if res.passed else 0.0,
            )
        )
    res.score = total(res, tests)


def speed_points(ex: Exercise, speedup: float) -> float:
    """Full speed points at the exercise's ``target`` speedup, proportionally fewer below."""
    sc = ex.scoring
    return float(sc["speed_weight"]) * min(1.0, speedup / float(sc["target"]))


def total(res: GradeResult, tests: list[TestResult]) -> float:
    """The score: the passed tests' points, 0 for any failing verdict."""
    # gated on correctness: any failing verdict scores 0
    if not res.passed:
        return 0.0
    return sum((t.points if t.points is not None else t.max_points) for t in tests if t.passed)


def rescore(ex: Exercise, res: GradeResult, speedup: float) -> None:
    """Score ``res`` (a PASS) at another speedup: the benchmark line and the total follow."""
    res.speedup = speedup
    for t in res.tests:
        if t.name == "benchmark":
            t.points = speed_points(ex, speedup)
            t.output = benchmark_line(res)
    res.score = total(res, res.tests)


def retime(ex: Exercise, first: GradeResult) -> bool:
    """Whether a passing first run's confirmation is timed again (grader spec §6: a ranked
    score needs a second passing run; top and anomalous scores an audit).

    Timed again: speedups at or above the exercise's ``target`` (full speed points, the top of
    the leaderboard, where one lucky timing would pay most) and runs flagged for review (a
    shape near the roofline floor). Below the target the second run only has to pass: the first
    run's speedup is a median over up to 200 paired calls (about 1 % of noise on the H200, so
    at most 0.5 % of the score), and at the clamp's floor a second timing could not lower it
    at all. A slower second timing would have ranked the submission at the lower of the two.
    """
    if first.speedup is None:
        return False
    return first.speedup >= float(ex.scoring["target"]) or bool(first.details.get("review"))


def confirm(ex: Exercise, first: GradeResult, second: GradeResult) -> GradeResult:
    """Combine a ranked-score candidate with its confirmation run (grader spec §6).

    A failing confirmation is the verdict (its hidden cases and seeds came from another
    secret: a submission tuned to one draw, or passing by luck, fails here). A passing one
    ranks the submission at the lower of the two speedups, so one lucky timing cannot lift it.
    """
    if not second.passed:
        second.output = f"confirmation run (new hidden cases and seeds): {second.output}"
        second.details["confirms_run"] = first.run_id
        second.elapsed_s += first.elapsed_s
        return second
    first.details["confirmation"] = {
        "run_id": second.run_id,
        "timed": second.speedup is not None,
        "speedup": second.speedup,
        "timings": [
            {"name": t.name, "n": t.n, "median_ms": t.median_ms, "speedup": t.speedup}
            for t in second.timings
        ],
    }
    first.elapsed_s += second.elapsed_s
    if second.speedup is not None and first.speedup is not None:
        ranked = min(first.speedup, second.speedup)
        rescore(ex, first, ranked)
        first.output += (
            f"; a second run with new hidden cases confirmed it ({second.speedup:.3f}x), "
            f"ranked at {ranked:.3f}x"
        )
    else:
        first.output += (
            f"; a second run with new hidden cases passed (not timed again: a speedup below "
            f"{float(ex.scoring['target']):.3f}x stands as measured)"
        )
    return first
