"""profile_nsa.py's bookkeeping on the CPU: calls and times per operator, and its table."""

from __future__ import annotations

import pytest
import torch

from benchmarks.profile_nsa import gap_table, idle_gaps, kernel_times, table


def test_kernel_times_counts_each_top_level_operator_per_step() -> None:
    a = torch.randn(64, 64)

    def step() -> torch.Tensor:
        return torch.mm(a, a).relu()

    spans: list[tuple[float, float, str]] = []
    times = kernel_times(step, steps=3, cuda=False, spans=spans)
    assert times["aten::mm"][0] == 3
    assert sorted(name for *_, name in spans) == ["aten::mm"] * 3 + ["aten::relu"] * 3
    assert all(end >= start for start, end, _ in spans)
    assert times["aten::relu"][0] == 3
    # relu's own clamp runs inside it: only top-level operators, so nothing counts twice
    assert "aten::clamp_min" not in times
    assert all(ms >= 0 for _, ms in times.values())


def test_table_orders_by_time_and_shares_add_up(capsys: pytest.CaptureFixture[str]) -> None:
    times = {"small": [2, 1.0], "big | pipe": [2, 3.0]}
    table(128, times, steps=2, step_ms=2.5)
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("### T=128: 2.00 ms of kernels a step; the step's median 2.50 ms")
    rows = [line for line in out if line.startswith("| ") and "---" not in line][1:]
    assert rows[0] == "| big / pipe | 1 | 1.500 | 75.0 % |"
    assert rows[1] == "| small | 1 | 0.500 | 25.0 % |"


def test_idle_gaps_between_kernels_with_overlaps(capsys: pytest.CaptureFixture[str]) -> None:
    # a [0, 10], b [12, 20], c [15, 30] overlapping b and holding f [16, 18] (other streams),
    # d [40, 41], e [41, 45]
    spans = [(40.0, 41.0, "d"), (0.0, 10.0, "a"), (15.0, 30.0, "c"), (12.0, 20.0, "b")]
    spans += [(41.0, 45.0, "e"), (16.0, 18.0, "f")]
    total, largest = idle_gaps(spans, top=1)
    assert total == pytest.approx(0.012)  # 2 µs before b, 10 µs before d; none inside c
    assert largest == [(pytest.approx(0.010), "c", "d")]
    assert idle_gaps([]) == (0.0, [])
    gap_table(spans, steps=2)
    out = capsys.readouterr().out
    assert "idle between kernels: 0.006 ms a step" in out
    assert "| 0.010 | c | d |" in out and "| 0.002 | a | b |" in out
