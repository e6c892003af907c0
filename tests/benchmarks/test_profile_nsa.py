"""profile_nsa.py's bookkeeping on the CPU: calls and times per operator, and its table."""

from __future__ import annotations

import pytest
import torch

from benchmarks.profile_nsa import kernel_times, table


def test_kernel_times_counts_each_top_level_operator_per_step() -> None:
    a = torch.randn(64, 64)

    def step() -> torch.Tensor:
        return torch.mm(a, a).relu()

    times = kernel_times(step, steps=3, cuda=False)
    assert times["aten::mm"][0] == 3
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
