"""benchmarks/ncu_summary.py reads ncu's raw CSV (header, units, one row per kernel)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks.ncu_summary import main

HEAD = [
    "ID",
    "Kernel Name",
    "gpu__time_duration.sum",
    "launch__registers_per_thread",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
]
UNITS = ["", "", "ms", "register/thread", "%", "%", "%", "inst", "inst"]


def test_summary_lists_each_kernel_with_its_busiest_pipes_and_stalls(
    tmp_path: Path, capsys
) -> None:
    path = tmp_path / "raw.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEAD)
        w.writerow(UNITS)
        w.writerow(
            [
                "0",
                "nsa_compressed_gluon_fwd_kernel",
                "16.1",
                "232",
                "41.5",
                "63.25",
                "0",
                "1.5",
                "0.25",
            ]
        )
        w.writerow(["1", "topn_kernel", "1,470.0", "64", "n/a", "2.0", "12.0", "0", "3.0"])
    assert main([str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    first = out.index("== nsa_compressed_gluon_fwd_kernel")
    assert "time 16.1 ms" in out[first + 1] and "regs 232 register/thread" in out[first + 1]
    # busiest first; zero and unparsable values left out
    assert out[first + 2] == "   pipes %: tensor_op_gmma 63.25, xu 41.50"
    assert out[first + 3] == "   stalls: wait 1.50, math_pipe_throttle 0.25"
    second = out.index("== topn_kernel")
    assert out[second + 2] == "   pipes %: fma 12.00, tensor_op_gmma 2.00"
    assert out[second + 3] == "   stalls: math_pipe_throttle 3.00"


def test_a_csv_without_kernels_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "raw.csv"
    path.write_text('"ID","Kernel Name"\n')
    with pytest.raises(SystemExit, match="no metric rows"):
        main([str(path)])
