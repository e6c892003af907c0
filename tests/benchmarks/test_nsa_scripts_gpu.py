"""The NSA benchmark scripts run end to end on a GPU, at a small shape.

They call the kernels' internals (``backward._forward_parts`` and the per-branch backwards)
on bf16 CUDA tensors, a path the CPU interpreter tests never take: run 58 found
``bench_nsa.py --backward`` broken there by a change the CPU suite passed. GPU only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SMALL = ["--seqs", "2048", "--hq", "16", "--hkv", "1", "--dim", "64"]


def _run(args: list[str]) -> str:
    env = {**os.environ, "NSA_AUTOTUNE": "0", "PYTHONUNBUFFERED": "1"}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def test_bench_nsa_backward_runs() -> None:
    out = _run(["benchmarks/bench_nsa.py", "--backward", "--no-flex", *SMALL])
    assert "| fwd+bwd |" in out
    assert "bwd compressed dq" in out


def test_sweep_nsa_runs() -> None:
    out = _run(["benchmarks/sweep_nsa.py", "--kernel", "cmp_dq", "--jobs", "2", *SMALL])
    assert "backward compressed dq" in out
    assert "(default)" in out
    assert "FAILED" not in out


def test_nsa_bwd_overlap_runs() -> None:
    out = _run(["benchmarks/nsa_bwd_overlap.py", "--rounds", "3", *SMALL])
    assert "| 2048 | serial |" in out and "| 2048 | side |" in out
    assert "dgates: side vs serial max abs 0.000e+00" in out  # no atomics on dgates' way


def test_nsa_overlap_runs() -> None:
    # the script itself asserts the two-stream outputs equal the serial ones
    out = _run(["benchmarks/nsa_overlap.py", "--rounds", "3", *SMALL])
    for mode in ("serial (cmp then slc, one stream)", "cmp alone", "slc alone"):
        assert f"| 2048 | {mode} |" in out
    assert out.count("| 2048 | two streams") == 3
    assert "best two-stream run" in out


def test_nsa_q_peak_ab_runs() -> None:
    # the script itself asserts the compressed kernel's scalar equals max |q|
    out = _run(["benchmarks/nsa_q_peak_ab.py", "--seq", "2048", "--rounds", "1", *SMALL[2:]])
    for row in ("forward, max |q| from the kernel", "forward, checks read q"):
        assert f"| {row} |" in out


def test_nsa_variant_ab_runs() -> None:
    out = _run(
        ["benchmarks/nsa_variant_ab.py", "--branch", "topn", "--values", "chunk4k", "float4k"]
        + ["--rounds", "1", *SMALL]
    )
    # the top-n forms pick the same blocks, so the forwards agree bit for bit
    for form in ("chunk4k", "float4k"):
        assert f"| 2048 | {form} |" in out and out.count("| bitwise equal |") == 2
