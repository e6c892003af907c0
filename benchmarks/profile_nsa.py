"""Where NSA's time goes, kernel by kernel: one profiled forward + backward (or forward).

    python benchmarks/profile_nsa.py [--seqs 65536] [--steps 3] [--forward-only]

bench_nsa.py --backward times each branch's kernels in isolation, on the forward's saved
tensors; this runs the real call (``torch.autograd.grad`` of ``nsa_attention``, every default
variant) under ``torch.profiler`` and sums each kernel's device time per step, so the
breakdown adds up to what the step costs, small torch kernels (sorts, copies, the pooling's
backward) and the dS buffer's use included. The step's CUDA-event median is printed beside
the sum: their gap is launch overhead and idle device time, which the second table locates
(idle time between kernels, and the largest gaps with the kernels on either side).

``--device cpu`` with TRITON_INTERPRET=1 and a tiny shape (``--seqs 128 --hq 4 --hkv 1
--dim 16``) smoke-tests it without a GPU: the table then lists the CPU's operators instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("NSA_AUTOTUNE", "0")  # each kernel's default config: what users run
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks._common import (  # noqa: E402
    commit,
    device_ready,
    median_ms,
    nsa_inputs,
    nsa_shape_args,
)
from kernels.nsa import NSAConfig, nsa_attention  # noqa: E402
from kernels.nsa.attention import variant  # noqa: E402

NAME_WIDTH = 72


Span = tuple[float, float, str]  # (start µs, end µs, kernel name)


def kernel_times(
    step: Callable[[], object], steps: int, cuda: bool, spans: list[Span] | None = None
) -> dict[str, list[float]]:
    """name → [calls, device ms] summed over ``steps`` profiled calls of ``step``; each
    counted event's (start, end, name) is appended to ``spans`` when given."""
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
        if spans is not None:
            spans.append((ev.time_range.start, ev.time_range.end, ev.name))
    return out


def idle_gaps(spans: list[Span], top: int = 5) -> tuple[float, list[tuple[float, str, str]]]:
    """Device time with no kernel running, between the first kernel and the last: (total ms,
    the ``top`` largest gaps as (ms, the kernel that ended last before it, the next one)).
    Overlapping kernels (other streams) count as busy until the latest of their ends."""
    total = 0.0
    gaps: list[tuple[float, str, str]] = []
    frontier, last = None, ""
    for start, end, name in sorted(spans):
        if frontier is not None and start > frontier:
            ms = (start - frontier) / 1e3
            total += ms
            gaps.append((ms, last, name))
        if frontier is None or end >= frontier:
            frontier, last = end, name
    return total, sorted(gaps, key=lambda g: -g[0])[:top]


def _short(name: str) -> str:
    short = name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"
    return short.replace("|", "/")  # a Markdown cell


def table(t: int, times: dict[str, list[float]], steps: int, step_ms: float) -> None:
    total = sum(ms for _, ms in times.values()) / steps
    print(f"\n### T={t}: {total:.2f} ms of kernels a step; the step's median {step_ms:.2f} ms")
    print("| kernel | calls a step | ms a step | share |")
    print("|---|---|---|---|")
    for name, (calls, ms) in sorted(times.items(), key=lambda kv: -kv[1][1]):
        per = ms / steps
        print(f"| {_short(name)} | {calls / steps:g} | {per:.3f} | {100 * per / total:.1f} % |")


def gap_table(spans: list[Span], steps: int) -> None:
    """Where the device waits: idle time between kernels a step, and the largest gaps (the
    ones between steps included: a step's start waits for the host)."""
    total, largest = idle_gaps(spans)
    print(f"\nidle between kernels: {total / steps:.3f} ms a step; the largest gaps:")
    print("| gap ms | after | before |")
    print("|---|---|---|")
    for ms, after, before in largest:
        print(f"| {ms:.3f} | {_short(after)} | {_short(before)} |")


def host_syncs(step: Callable[[], object]) -> list[str]:
    """The host syncs one call of ``step`` makes, as "file:line: message" in call order
    (``torch.cuda.set_sync_debug_mode``: .item(), nonzero, blocking copies, ...)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [
        f"{Path(w.filename).name}:{w.lineno}: {str(w.message).splitlines()[0]}"
        for w in caught
        if "synchroniz" in str(w.message)
    ]


ALLOC_STATS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")


def allocator_counts() -> dict[str, int]:
    """The caching allocator's counters that stall the device: retries (cudaFree of the cache
    and a second try) and the raw cudaMalloc / cudaFree calls (cudaFree synchronizes)."""
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in ALLOC_STATS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    nsa_shape_args(ap, [65536])
    ap.add_argument("--steps", type=int, default=3, help="profiled steps per length")
    ap.add_argument("--forward-only", action="store_true", help="profile the forward alone")
    ap.add_argument("--device", default="cuda", help="cpu needs TRITON_INTERPRET=1")
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
    before = allocator_counts() if cuda else {}
    step_ms = median_ms(step, cuda)
    if cuda:
        after = allocator_counts()
        moved = ", ".join(f"{k} +{after[k] - before[k]}" for k in ALLOC_STATS)
        peak = torch.cuda.max_memory_reserved() / 2**30
        print(f"\nallocator over the timed steps: {moved}; peak reserved {peak:.1f} GiB")
        syncs = host_syncs(step)
        print(f"host syncs in one step: {len(syncs)}")
        for line in syncs:
            print(f"- {line}")
    spans: list[Span] = []
    table(t, kernel_times(step, args.steps, cuda, spans), args.steps, step_ms)
    gap_table(spans, args.steps)


if __name__ == "__main__":
    main()
