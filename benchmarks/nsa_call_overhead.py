"""What NSA forward's value checks cost a call as the grader times it (issues 18, 19).

``nsa_attention`` on bf16 inputs reads, on the host, whether every gate lies in [0, 1] and
max |q|, |k|, |v| (k̃'s storage depends on it): ``validate.check_values``, one wait on the
GPU a call since it does both. The grader times short calls (the exercise's benchmark shape,
T = 8k), one at a time between CUDA events with a sync after each, so the launches after a
wait are inside the measured time. This script times the same call three ways, round-robin
(one call of each per round, so drift hits all alike):

- ``two``: the checks as they were before they shared a sync (the gates' comparison, then
  the fused max-|x| read: two waits);
- ``one``: the current ``check_values`` (one wait);
- ``none``: no check at all (gates and fp16 taken on trust): the bound on removing the wait.

    python benchmarks/nsa_call_overhead.py                  # the exercise's shape, 300 rounds
    python benchmarks/nsa_call_overhead.py --seq 65536 --hq 64 --hkv 4 --rounds 30
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.nsa.validate as validate  # noqa: E402
from benchmarks._common import commit  # noqa: E402
from kernels.nsa import NSAConfig, nsa_attention  # noqa: E402

Check = Callable[[torch.Tensor, tuple[torch.Tensor | None, ...] | None], float | None]


def _two_syncs(
    gates: torch.Tensor, peak_of: tuple[torch.Tensor | None, ...] | None
) -> float | None:
    if not bool(((gates >= 0) & (gates <= 1)).all()):
        raise ValueError("gates must lie in [0, 1]")
    if peak_of is None:
        return None
    live = [x for x in peak_of if x is not None and x.numel() > 0]
    return float(torch.stack(torch._foreach_norm(live, float("inf"))).max())


CHECKS: dict[str, Check] = {
    "two": _two_syncs,
    "one": validate.check_values,
    "none": lambda gates, peak_of: None if peak_of is None else 0.0,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--hq", type=int, default=16)
    ap.add_argument("--hkv", type=int, default=1)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA: the check only runs on the Triton path")
    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dev, torch.bfloat16)

    t, hq, hkv, d = args.seq, args.hq, args.hkv, args.dim
    q, k, v = rnd(1, t, hq, d), rnd(1, t, hkv, d), rnd(1, t, hkv, d)
    gates = torch.rand(1, t, hq, 3, generator=gen).to(dev, torch.bfloat16)
    cfg = NSAConfig()
    outs = {}
    for name, check in CHECKS.items():  # warm-up: compile and autotune once, same output
        validate.check_values = check
        for _ in range(3):
            outs[name] = nsa_attention(q, k, v, gates, cfg)
    torch.cuda.synchronize()
    assert all(torch.equal(outs["one"], o) for o in outs.values()), "the checks disagree"

    ev = {n: [] for n in CHECKS}
    wall = {n: [] for n in CHECKS}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.rounds):
        for name, check in CHECKS.items():
            validate.check_values = check
            w0 = time.perf_counter()
            start.record()
            nsa_attention(q, k, v, gates, cfg)
            end.record()
            end.synchronize()
            wall[name].append(1e3 * (time.perf_counter() - w0))
            ev[name].append(start.elapsed_time(end))
    validate.check_values = CHECKS["one"]

    print(
        f"# nsa_call_overhead.py, commit {commit()}, {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}, T {t}, Hq {hq} / Hkv {hkv}, D {d}, bf16, paper config, "
        f"{args.rounds} rounds"
    )
    print(
        "| check | event ms, median (p10-p90) | host wall ms, median | of `none`, paired median |"
    )
    print("|---|---|---|---|")
    for name in CHECKS:
        xs = sorted(ev[name])
        p10, p90 = xs[len(xs) // 10], xs[(9 * len(xs)) // 10]
        paired = statistics.median(a / b for a, b in zip(ev[name], ev["none"], strict=True))
        print(
            f"| {name} | {statistics.median(xs):.3f} ({p10:.3f}-{p90:.3f}) "
            f"| {statistics.median(wall[name]):.3f} | {paired:.4f} |"
        )


if __name__ == "__main__":
    main()
