"""Where NSA's time goes, kernel by kernel: one profiled forward + backward (or forward).

    python benchmarks/profile_nsa.py [--seqs 65536] [--steps 3] [--forward-only]

bench_nsa.py --backward times each branch's kernels in isolation, on the forward's saved
tensors; this runs the real call (``torch.autograd.grad`` of ``nsa_attention``, every default
variant) under ``torch.profiler`` and sums each kernel's device time per step, so the
breakdown adds up to what the step costs, small torch kernels (sorts, copies, the pooling's
backward) and the dS buffer's use included. The step's CUDA-event median is printed beside
the sum: their gap is launch overhead and idle device time.

``--device cpu`` with TRITON_INTERPRET=1 and a tiny shape (``--seqs 128 --hq 4 --hkv 1
--dim 16``) smoke-tests it without a GPU: the table then lists the CPU's operators instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("NSA_AUTOTUNE", "0")  # each kernel's default config: what users run
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks._common import commit, device_ready, median_ms, nsa_inputs  # noqa: E402
from kernels.nsa import NSAConfig, nsa_attention  # noqa: E402
from kernels.nsa.attention import variant  # noqa: E402

NAME_WIDTH = 72


def kernel_times(step: Callable[[], object], steps: int, cuda: bool) -> dict[str, list[float]]:
    """name → [calls, device ms] summed over ``steps`` profiled calls of ``step``."""
    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if cuda and ev.device_type.name != "CUDA":
            continue
        if not cuda and ev.cpu_parent is not None:  # top-level operators only: no double count
            continue
        us = ev.device_time_total if cuda else ev.cpu_time_total
        out[ev.name][0] += 1
        out[ev.name][1] += us / 1e3
    return out


def table(t: int, times: dict[str, list[float]], steps: int, step_ms: float) -> None:
    total = sum(ms for _, ms in times.values()) / steps
    print(f"\n### T={t}: {total:.2f} ms of kernels a step; the step's median {step_ms:.2f} ms")
    print("| kernel | calls a step | ms a step | share |")
    print("|---|---|---|---|")
    for name, (calls, ms) in sorted(times.items(), key=lambda kv: -kv[1][1]):
        short = name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"
        short = short.replace("|", "/")  # a Markdown cell
        per = ms / steps
        print(f"| {short} | {calls / steps:g} | {per:.3f} | {100 * per / total:.1f} % |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[65536])
    ap.add_argument("--steps", type=int, default=3, help="profiled steps per length")
    ap.add_argument("--forward-only", action="store_true", help="profile the forward alone")
    ap.add_argument("--device", default="cuda", help="cpu needs TRITON_INTERPRET=1")
    ap.add_argument("--hq", type=int, default=64)
    ap.add_argument("--hkv", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    args = ap.parse_args()
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    if not device_ready(args.device, "profile_nsa"):
        return
    cuda = args.device.startswith("cuda")
    cfg = NSAConfig()
    mode = "fwd" if args.forward_only else "fwd+bwd"
    chosen = ", ".join(f"{b} {variant(b)}" for b in ("selection", "compressed", "selection_dq"))
    print(
        f"## NSA {mode} kernel by kernel, B=1 Hq={args.hq} Hkv={args.hkv} D={args.dim} bf16, "
        f"paper config ({chosen}); device ms per step over {args.steps} profiled steps; "
        f"commit {commit()}"
    )
    for t in args.seqs:
        one(t, args, cfg, cuda)
        if cuda:
            torch.cuda.empty_cache()


def one(t: int, args: argparse.Namespace, cfg: NSAConfig, cuda: bool) -> None:
    """One length's table (a function: its tensors are freed on return)."""
    q, k, v, gates, dout = nsa_inputs(t, args.hq, args.hkv, args.dim, args.device, with_dout=True)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, gates)]

    def step() -> object:
        if args.forward_only:
            with torch.no_grad():
                return nsa_attention(q, k, v, gates, cfg)
        return torch.autograd.grad(nsa_attention(*leaves, cfg), leaves, dout)

    step()  # compile and warm up outside the profile
    step_ms = median_ms(step, cuda)
    table(t, kernel_times(step, args.steps, cuda), args.steps, step_ms)


if __name__ == "__main__":
    main()
