"""results.json schema (grader spec §10) and the verdict enum (§9)."""

from __future__ import annotations

import pytest

from workers.results import GradeResult, ResultsError, TestResult, validate_results
from workers.verdicts import VERDICTS, Verdict


def _result(**kw) -> GradeResult:  # type: ignore[no-untyped-def]
    base = {
        "exercise": "attention-merge",
        "verdict": Verdict.PASS,
        "score": 1.0,
        "tests": [
            TestResult("public/a", 0.5, True, "ok"),
            TestResult("hidden/0", 0.5, True, "secret detail", "hidden"),
        ],
    }
    base.update(kw)
    return GradeResult(**base)


def test_verdict_enum_matches_spec() -> None:
    assert set(VERDICTS) == {
        "PASS",
        "WRONG_ANSWER",
        "TYPE_VIOLATION",
        "INPUT_MUTATED",
        "POLICY_VIOLATION",
        "INTEGRITY_VIOLATION",
        "TIMEOUT",
        "RESOURCE_LIMIT",
        "RUNTIME_ERROR",
        "INFRA_ERROR",
    }


def test_valid_result_has_both_lms_fields() -> None:
    doc = _result().to_results_json()
    assert doc["gradable"] is True and doc["verdict"] == "PASS"
    for t in doc["tests"]:
        assert {
            "name",
            "points",
            "max_points",
            "score",
            "max_score",
            "status",
            "output",
            "visibility",
        } <= set(t)
    hidden = [t for t in doc["tests"] if t["visibility"] == "hidden"]
    assert hidden and all(t["output"] == "" for t in hidden)  # hidden tests: pass/fail only


def test_infra_error_is_not_gradable() -> None:
    doc = _result(verdict=Verdict.INFRA_ERROR, score=0.0).to_results_json()
    assert doc["gradable"] is False


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(score=1.5),
        lambda d: d.update(score=float("nan")),
        lambda d: d.update(verdict="ALMOST"),
        lambda d: d.update(verdict="WRONG_ANSWER"),  # failing verdict with score 1 (ungated)
        lambda d: d["tests"][0].pop("max_points"),
        lambda d: d["tests"][0].update(visibility="secret"),
        lambda d: d.update(output="x" * 1_100_000),
        lambda d: d["leaderboard"].append({"name": "s", "value": 1, "order": "up"}),
    ],
)
def test_invalid_results_rejected(mutate) -> None:  # type: ignore[no-untyped-def]
    doc = _result().to_results_json()
    mutate(doc)
    with pytest.raises(ResultsError):
        validate_results(doc)


def test_output_is_capped() -> None:
    doc = _result(output="y" * 100_000).to_results_json()
    assert len(doc["output"]) <= 16_000
