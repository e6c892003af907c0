"""A/B of nsa_attention's whole forward under the variants of one branch (issue 19), in one
process, round-robin: each round times every variant once, so clock drift between rounds hits
all of them alike, and the ratio to the first variant is the median of the rounds' ratios.

    python benchmarks/nsa_variant_ab.py --branch topn --values chunk4k float4k --seqs 65536
    python benchmarks/nsa_variant_ab.py --branch selection --values v5 v2 --rounds 7

A variant's table and a component's own time (``bench_nsa.py --variants``) say what a kernel
costs alone; this says what the forward gains, which is what a default is chosen by. Each
variant's output is compared with the first's: the top-n forms must agree bit for bit (their
picks are the same), other branches to within their rounding. ``--device cpu`` with
``TRITON_INTERPRET=1`` and a tiny shape is a smoke test (wall-clock times, not a measurement).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

os.environ.setdefault("NSA_AUTOTUNE", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.nsa.attention as attention  # noqa: E402
from benchmarks._common import (  # noqa: E402
    commit,
    device_ready,
    diff,
    median_ms,
    nsa_inputs,
    nsa_shape_args,
    paired_median,
)
from kernels.nsa import NSAConfig, nsa_attention  # noqa: E402

BRANCHES = ("selection", "compressed", "window", "topn")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--branch", choices=BRANCHES, required=True)
    ap.add_argument("--values", nargs="+", required=True, help="variant names; the first is A")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cpu needs TRITON_INTERPRET=1")
    nsa_shape_args(ap, [65536])
    args = ap.parse_args(argv)
    if len(set(args.values)) != len(args.values) or len(args.values) < 2:
        ap.error("--values: at least two different variant names")
    for name in args.values:  # an unknown name fails here, not after minutes of timing
        attention.VARIANTS[args.branch] = name
        try:
            attention.variant(args.branch)
        except ValueError as exc:
            ap.error(f"--values: {exc}")
        finally:
            attention.VARIANTS[args.branch] = None
    return args


def run(args: argparse.Namespace) -> None:
    print(
        f"# nsa_variant_ab.py, commit {commit()}, branch {args.branch}, "
        f"Hq {args.hq} / Hkv {args.hkv}, D {args.dim}, bf16, paper config, {args.rounds} rounds"
    )
    print(f"| T | {args.branch} | forward, ms (median of rounds) | min | max | ÷ {args.values[0]} "
          f"(median of rounds' ratios) | output vs {args.values[0]} |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for t in args.seqs:
        one_length(t, args)
        if args.device == "cuda":
            torch.cuda.empty_cache()


def one_length(t: int, args: argparse.Namespace) -> None:
    cuda = args.device == "cuda"
    cfg = NSAConfig()
    q, k, v, g = nsa_inputs(t, args.hq, args.hkv, args.dim, args.device)
    outs: dict[str, torch.Tensor] = {}
    times: dict[str, list[float]] = {name: [] for name in args.values}
    try:
        for name in args.values:  # compile and check first, outside the timed rounds
            attention.VARIANTS[args.branch] = name
            outs[name] = nsa_attention(q, k, v, g, cfg)
        for _ in range(args.rounds):
            for name in args.values:
                attention.VARIANTS[args.branch] = name
                times[name].append(median_ms(lambda: nsa_attention(q, k, v, g, cfg), cuda))
    finally:
        attention.VARIANTS[args.branch] = None
    a = args.values[0]
    for name, ts in times.items():
        same = "bitwise equal" if torch.equal(outs[name], outs[a]) else diff(outs[name], outs[a])
        print(
            f"| {t} | {name} | {statistics.median(ts):.3f} | {min(ts):.3f} | {max(ts):.3f} "
            f"| {paired_median(ts, times[a]):.4f} | {same} |"
        )


def main() -> None:
    args = parse()
    if not device_ready(args.device, "nsa_variant_ab.py"):
        raise SystemExit(2)
    run(args)


if __name__ == "__main__":
    main()
