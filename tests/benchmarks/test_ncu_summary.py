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


# the page's columns that matter, and a "(Not Issued)" one that must not count twice
SOURCE_HEAD = [
    "Address",
    "Source",
    "Warp Stall Sampling (All Samples)",
    "Instructions Executed",
    "stall_barrier",
    "stall_wait",
    "stall_barrier (Not Issued)",
]


def _source_csv(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "nsa_compressed_gluon_fwd_kernel"])
        w.writerow(SOURCE_HEAD)
        w.writerows(rows)
    return path


def test_source_summary_splits_the_sass_at_each_partition_and_names_the_hottest(
    tmp_path: Path, capsys
) -> None:
    """A consumer region (MMA, mostly waits) and an idle region parked at the join barrier:
    each region's share and reasons, its hottest instruction and what precedes it."""
    rows = [  # address, SASS, samples, executed, barrier, wait, barrier (not issued)
        ["0x0", "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8", "0", "2", "0", "0", "0"],
        ["0x10", "HGMMA.64x64x16.F32 R24, gdesc[UR4], RZ", "10", "2", "0", "10", "0"],
        ["0x18", "@!P0 FADD R2, R3, R4", "0", "6", "0", "0", "0"],
        ["0x20", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "20", "2", "15", "5", "3"],
        ["0x30", "USETMAXREG.DEALLOC.CTAPOOL 0x18", "0", "1", "0", "0", "0"],
        ["0x40", "BAR.SYNC.DEFER_BLOCKING 0x1", "0", "1", "0", "0", "0"],
        ["0x50", "NOP", "70", "1", "70", "0", "70"],
    ]
    path = _source_csv(tmp_path / "source.csv", rows)
    assert main(["--source", str(path), "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "== nsa_compressed_gluon_fwd_kernel: 100 samples over 7 SASS instructions"
    assert out[1] == (
        "   SASS [0, 4): 30.0 % of samples, 1 MMA; barrier 50%, wait 50%; "
        "hottest WARPGROUP.DEPBAR.LE gsb0, 0x0 (after @!P0 FADD R2, R3, R4)"
    )
    # the predicated FADD counts as FADD; the idle region gets no such line
    assert out[2] == "      executed: FADD 50%, HGMMA 17%"  # --top 2; ties by name
    assert out[3] == (
        "   SASS [4, 7): 70.0 % of samples, 0 MMA; barrier 100%; "
        "hottest NOP (after BAR.SYNC.DEFER_BLOCKING 0x1)"
    )
    assert out[4] == "   hottest instructions:"
    assert out[5].split()[:3] == ["6", "70.00", "%"] and out[5].endswith("barrier 100%")
    assert out[6].split()[0] == "3" and out[6].endswith("barrier 75%, wait 25%")


def test_source_summary_refuses_a_raw_page_or_an_unsampled_kernel(tmp_path: Path) -> None:
    raw = tmp_path / "raw.csv"
    raw.write_text('"ID","Kernel Name"\n"","ms"\n"0","k"\n')
    with pytest.raises(SystemExit, match="not a source page"):
        main(["--source", str(raw)])
    empty = _source_csv(tmp_path / "source.csv", [["0x0", "NOP", "0", "1", "0", "0", "0"]])
    with pytest.raises(SystemExit, match="no warp-stall samples"):
        main(["--source", str(empty)])
