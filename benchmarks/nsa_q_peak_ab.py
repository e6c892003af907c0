"""A/B of where nsa_attention's range check gets max |q| (issue 19): from the compressed
Gluon kernel (``late_q``, the current code) or from the checks' own read of q (up to
`37b41f5`). Round-robin do_bench medians at the paper config, the compressed kernel alone and
the whole forward, each way.

    python benchmarks/nsa_q_peak_ab.py --seq 65536 --rounds 5
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

import triton  # noqa: E402

import kernels.nsa.attention as attention  # noqa: E402
from benchmarks._common import commit, nsa_head_args, nsa_inputs, stored_compressed  # noqa: E402
from benchmarks.nsa_call_overhead import q_read_by_checks  # noqa: E402
from kernels.nsa import NSAConfig, nsa_attention  # noqa: E402
from kernels.nsa.compressed import COMPRESSED_IMPLS  # noqa: E402

_FAST = attention.check_fast_args


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=65536)
    ap.add_argument("--rounds", type=int, default=5)
    nsa_head_args(ap)
    args = ap.parse_args()
    cfg = NSAConfig()
    q, k, v, g = nsa_inputs(args.seq, args.hq, args.hkv, args.dim, "cuda")
    kc_hi, kc_lo, vc, o_dtype = stored_compressed(k, v, cfg)
    cmp = COMPRESSED_IMPLS[attention.variant("compressed")]
    peak = torch.zeros(1, device=q.device)
    scale = args.dim**-0.5
    calls = {
        "cmp kernel + top-n, q_peak": lambda: cmp(
            q, kc_hi, vc, cfg, scale, True, kc_lo=kc_lo, out_dtype=o_dtype, q_peak=peak
        ),
        "cmp kernel + top-n, none": lambda: cmp(
            q, kc_hi, vc, cfg, scale, True, kc_lo=kc_lo, out_dtype=o_dtype
        ),
        "forward, max |q| from the kernel": lambda: nsa_attention(q, k, v, g, cfg),
        "forward, checks read q": lambda: nsa_attention(q, k, v, g, cfg),
    }
    times: dict[str, list[float]] = {n: [] for n in calls}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            attention.check_fast_args = q_read_by_checks if "read q" in name else _FAST
            times[name].append(triton.testing.do_bench(fn, warmup=10, rep=300))
    attention.check_fast_args = _FAST
    print(
        f"# nsa_q_peak_ab.py, commit {commit()}, {torch.cuda.get_device_name()}, T {args.seq}, "
        f"Hq {args.hq} / Hkv {args.hkv}, D {args.dim}, bf16, paper config, {args.rounds} rounds"
    )
    print("| call | do_bench medians over rounds, ms | min | max |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.3f} | {min(ts):.3f} | {max(ts):.3f} |")
    # the kernel's scalar after every call: max |q| exactly
    assert float(peak) == float(q.float().abs().max()), (float(peak), float(q.abs().max()))


if __name__ == "__main__":
    main()
