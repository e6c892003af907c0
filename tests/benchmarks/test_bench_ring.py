"""benchmarks/bench_ring.py on CPU: its arguments, plan and table, and one gloo run of 4 ranks.

The script's measurement needs 4 or 8 GPUs; CI checks everything around it, so the GPU run
meets a script that starts, parses its lengths, checks every rank and prints its table.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/bench_ring.py"


@pytest.fixture(scope="module")
def br() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_ring", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_ring"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_lengths_parse_and_print(br: ModuleType) -> None:
    assert br.parse_lengths("128k,256k,512k") == [131072, 262144, 524288]
    assert br.parse_lengths("65536, 1m") == [65536, 1 << 20]
    assert [br.fmt_len(t) for t in (65536, 524288, 1 << 20, 96)] == ["64k", "512k", "1M", "96"]
    for bad in ("0", "12q", "k", "-4"):
        with pytest.raises(Exception, match="not a sequence length"):
            br.parse_len(bad)


def test_efficiency_against_a_shorter_one_gpu_run_scales_by_t_squared(br: ModuleType) -> None:
    base = {"cudnn": (100.0, 262144), "triton": (50.0, 131072)}
    assert br.against(base, "cudnn", 262144) == (100.0, "1 GPU cudnn, full T")
    ms, what = br.against(base, "cudnn", 524288)
    assert ms == 400.0 and what == "1 GPU cudnn at 256k x4 (T^2)"
    ms, what = br.against({}, "cudnn", 524288)
    assert ms != ms and "no 1-GPU cudnn" in what  # NaN: no baseline, no efficiency


def test_table_marks_failures_notes_and_the_baseline(br: ModuleType) -> None:
    rows = [
        br.Row(131072, "1 GPU cudnn (full T)", ms=230.0, tflops=600.0),
        br.Row(
            131072,
            "ring zigzag [cudnn blocks]",
            ms=31.25,
            tflops=550.0,
            eff=0.92,
            against="1 GPU cudnn, full T",
            vs_cp=1.04,
            check="ok 8/8: out rel 3.0e-03 (rank 5), lse 1.9e-06 (rank 2) vs 1 GPU cudnn output",
        ),
        br.Row(131072, "ring contiguous [triton blocks]", note="RuntimeError('x')", failed=True),
        br.Row(131072, "torch context_parallel", note="not run: CUDA only"),
    ]
    lines = br.fmt_table(rows, "title").splitlines()
    assert lines[0] == "title" and lines[2].startswith("| T | run | ms |")
    assert (
        "| 128k | ring zigzag [cudnn blocks] | 31.25 | 550 | 92.0 % | 1 GPU cudnn, full T |"
        in (lines[5])
    )
    assert "| 1.040x | ok 8/8" in lines[5]
    assert "| failed |" in lines[6] and "RuntimeError('x')" in lines[6]
    assert lines[7].endswith("| torch context_parallel | - | - | - | - | - | not run: CUDA only |")


def test_dry_run_prints_the_plan_of_the_eight_gpu_run(
    br: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    br.main(["--dry-run", "--world", "8", "--seq", "128k,256k,512k"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    # per length: 2 one-GPU baselines, 2 layouts x 2 block kernels, 2 context_parallel rotations
    assert len(rows) == 3 * 8
    assert sum("torch context_parallel (alltoall, cudnn)" in r for r in rows) == 3
    assert {r.split("|")[1].strip() for r in rows} == {"128k", "256k", "512k"}
    assert "P=8" in out


def test_lengths_must_split_into_the_zigzag_chunks(br: ModuleType) -> None:
    with pytest.raises(SystemExit, match="divisible by 16"):
        br.main(["--dry-run", "--world", "8", "--seq", "1000"])


@pytest.mark.slow
def test_cpu_gloo_run_of_four_ranks(tmp_path: Path) -> None:
    """The whole script on 4 gloo ranks with tiny shapes: the second length is beyond
    ``--one-gpu-max-seq``, so its efficiency uses the scaled baseline and each rank is checked
    against our kernel over its own rows."""
    out_json = tmp_path / "rows.json"
    cmd = [
        sys.executable,
        str(SCRIPT),
        *("--device", "cpu", "--world", "4", "--seq", "64,128", "--heads", "2", "--dim", "16"),
        *("--iters", "2", "--warmup", "1", "--one-gpu-max-seq", "64"),
        *("--start-method", "forkserver", "--json", str(out_json)),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "| T | run | ms |" in res.stdout
    doc = json.loads(out_json.read_text())
    assert "P=4" in doc["title"]
    rows = {(r["seq"], r["run"]): r for r in doc["rows"]}
    for t in (64, 128):
        for layout in ("zigzag", "contiguous"):
            r = rows[t, f"ring {layout} [triton blocks]"]
            assert r["ms"] > 0 and not r["failed"], r
            assert r["check"].startswith("ok 4/4"), r
            assert r["eff"] > 0
    assert rows[128, "1 GPU triton at T=64 (--one-gpu-max-seq)"]["ms"] > 0
    assert rows[128, "ring zigzag [triton blocks]"]["against"] == "1 GPU triton at 64 x4 (T^2)"
    assert "over each rank's rows" in rows[128, "ring zigzag [triton blocks]"]["check"]
    assert "imports resolve" in rows[64, "torch context_parallel"]["note"]
