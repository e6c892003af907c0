"""What a student reads in a result: a failing comparison says which tensor, which element, by
how much and against what tolerance; a GPU result places the kernel on the H200's roofline
beside its speedup (CPU rehearsals have none, so the computation is tested here)."""

from __future__ import annotations

import math

import pytest
import torch

from workers.exercises import load_exercise
from workers.harness import roofline
from workers.harness.scoring import benchmark_line, rescore, score
from workers.problems.common import compare
from workers.results import GradeResult, ShapeTiming, TestResult, validate_results
from workers.verdicts import Verdict

# -- messages per failing comparison


def _gold() -> torch.Tensor:
    return torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_the_worst_element_its_values_and_the_tolerance() -> None:
    gold = _gold()
    out = gold.clone()
    out[1, 2, 0, 4] += 0.5
    out[0, 0, 0, 0] += 0.1
    c = compare("out", out, gold, gold.float(), k=2.0, atol_floor=1e-3)
    assert c.verdict is Verdict.WRONG_ANSWER
    want = float(gold[1, 2, 0, 4])
    assert f"out[1, 2, 0, 4] = {want + 0.5:.6g} (expected {want:.6g}" in c.message
    assert "max abs error 0.5 exceeds the tolerance" in c.message
    assert "tolerance = 2 x" in c.message and "+ 0.001" in c.message


def test_nan_and_missing_minus_inf_are_located() -> None:
    gold = _gold()
    out = gold.clone()
    out[0, 1, 2, 3] = float("nan")
    c = compare("out", out, gold, None, k=2.0, atol_floor=1e-3)
    assert c.message.startswith("out: 1 NaN/Inf value; the first: out[0, 1, 2, 3] = nan")
    lse = _gold()[..., 0]
    lse[1, 1, :] = -math.inf  # an empty row
    got = lse.clone()
    got[1, 1, 2] = 0.25
    c = compare("lse", got, lse, None, k=2.0, atol_floor=1e-3)
    assert "1 position should be -inf (empty rows)" in c.message
    assert "lse[1, 1, 2] = 0.25 (expected -inf" in c.message


def test_empty_rows_are_never_the_worst_element() -> None:
    gold = _gold()[..., 0]
    gold[0, 0, :] = -math.inf
    out = gold.clone()
    out[1, 2, 3] += 1.0
    c = compare("lse", out, gold, None, k=2.0, atol_floor=1e-3, max_abs=0.5)
    assert "lse[1, 2, 3]" in c.message


def test_rms_and_allclose_failures_say_where_the_worst_is() -> None:
    gold = _gold()
    out = gold + 1e-3
    out[0, 2, 1, 1] += 5e-3
    c = compare("out", out, gold, gold, k=1e9, atol_floor=1.0, rms_k=1.0)
    assert "RMS error" in c.message and "out[0, 2, 1, 1]" in c.message
    c = compare("out", out, gold, None, k=2.0, atol_floor=1.0, allclose=(1e-4, 0.0))
    assert "120 elements outside" in c.message and "out[0, 2, 1, 1]" in c.message


def test_a_passing_comparison_is_unchanged() -> None:
    gold = _gold()
    c = compare("out", gold.clone(), gold, gold.float(), k=2.0, atol_floor=1e-3)
    assert c.ok and c.message == "" and c.metrics["max_err"] == 0.0


# -- the roofline


def test_roofline_position_against_the_h200_peaks() -> None:
    # 990 TFLOP in 2 s and 4.8 TB in 2 s: half of each peak
    p = roofline.position(990e12, 4.8e12, 2000.0)
    assert p is not None
    assert p["tflops"] == pytest.approx(495.0) and p["tbytes_s"] == pytest.approx(2.4)
    assert p["flops_frac"] == pytest.approx(0.5) and p["bytes_frac"] == pytest.approx(0.5)
    # memory-bound: bytes dominate; peak_frac is floor / time
    p = roofline.position(1e10, 4.8e9, 2.0)
    assert p is not None and p["bound"] == "memory"
    assert p["peak_frac"] == pytest.approx(roofline.floor_ms(1e10, 4.8e9) / 2.0, rel=1e-3)
    assert p["bytes_frac"] == pytest.approx(0.5) and p["flops_frac"] < 0.01
    assert roofline.position(1.0, 1.0, 0.0) is None
    assert roofline.position(1.0, 1.0, math.inf) is None


def test_roofline_floor_is_the_checker_floor() -> None:
    assert roofline.floor_ms(990e12, 0.0) == pytest.approx(1000.0)
    assert roofline.floor_ms(0.0, 4.8e12) == pytest.approx(1000.0)


def test_roofline_summary_is_a_geometric_mean() -> None:
    a = roofline.position(990e12, 0.0, 4000.0)  # 25 %
    b = roofline.position(990e12, 0.0, 1000.0)  # 100 %
    s = roofline.summary([a, b])
    assert s is not None and s["peak_frac"] == pytest.approx(0.5)
    assert s["gpu"] == "H200" and s["peak_tflops"] == 990.0 and s["peak_tbytes_s"] == 4.8
    assert roofline.summary([a, None]) is None  # a shape without a position: no summary
    assert roofline.summary([]) is None
    assert "50 % of the H200 roofline" in roofline.summary_text(s)
    assert "compute-bound at 25 %" in roofline.describe(a)


def _timed_result(device: str) -> GradeResult:
    shape = {"B": 1}
    pos = roofline.position(5e12, 2e9, 10.0) if device == "cuda" else None
    r = GradeResult(
        exercise="attention-merge",
        verdict=Verdict.PASS,
        score=1.0,
        device=device,
        speedup=1.25,
        timings=[ShapeTiming("s", shape, 30, 10.0, 10.1, 0.2, 9.9, 0.01, 12.5, 1.25, pos)],
        roofline=roofline.summary([pos]) if pos else None,
    )
    return r


def test_the_roofline_is_in_the_result_beside_the_speedup() -> None:
    ex = load_exercise("attention-merge")
    r = _timed_result("cuda")
    tests = [TestResult("hidden/0", 0.0, True)]
    score(ex, r, tests)
    r.tests = tests
    line = next(t.output for t in tests if t.name == "benchmark")
    assert line.startswith("speedup 1.250x; ") and "% of the H200 roofline" in line
    doc = r.to_results_json()
    validate_results(doc)
    k = doc["kgrade"]
    assert k["roofline"]["peak_frac"] == r.roofline["peak_frac"]
    t = k["timings"][0]["roofline"]
    assert t["tflops"] == pytest.approx(500.0) and t["bound"] in ("compute", "memory")
    rescore(ex, r, 1.1)  # a confirmation's lower speedup keeps the roofline on the line
    line = next(t.output for t in r.tests if t.name == "benchmark")
    assert line.startswith("speedup 1.100x; ") and "roofline" in line


def test_no_roofline_on_cpu() -> None:
    r = _timed_result("cpu")
    assert benchmark_line(r) == "speedup 1.250x"
    doc = r.to_results_json()
    assert doc["kgrade"]["roofline"] is None and doc["kgrade"]["timings"][0]["roofline"] is None
