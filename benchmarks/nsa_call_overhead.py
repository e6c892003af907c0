"""What NSA forward's value checks cost a call as the grader times it (issues 18, 19).

``nsa_attention`` on bf16 inputs checks that every gate lies in [0, 1] and reads max |q|, |k|,
|v| (k̃'s storage depends on it): ``validate.ValueChecks``, one read on the host. The grader
times short calls (the exercise's benchmark shape, T = 8k), one at a time between CUDA events
with a sync after each, so whatever the device waits for inside a call is measured. This
script times the same call three ways, round-robin (one call of each per round, so drift hits
all alike):

- ``start``: the checks read before the kernels are launched (as up to `a6296a9`: the device
  idles while the host launches what follows the read);
- ``end``: the current code: the checks launched first, read after the kernels are launched
  (k̃'s storage guessed fp16 meanwhile, the forward run again if the guess was wrong), max |q|
  from the compressed kernel (``ValueChecks.late_peak``);
- ``end-q``: as ``end``, but the checks read q themselves (up to `37b41f5`);
- ``none``: no check at all (gates and fp16 taken on trust): the bound on what the checks cost.

    python benchmarks/nsa_call_overhead.py                  # the exercise's shape, 300 rounds
    python benchmarks/nsa_call_overhead.py --seq 65536 --hq 64 --hkv 4 --rounds 30
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.nsa.attention as attention  # noqa: E402
import kernels.nsa.validate as validate  # noqa: E402
from benchmarks._common import commit, paired_median, spread  # noqa: E402
from kernels.nsa import NSAConfig, nsa_attention  # noqa: E402

_CHECKS, _FAST_ARGS = validate.ValueChecks, attention.check_fast_args


class _Trusted:
    """ValueChecks that launch nothing and read nothing: gates valid, every value fits fp16."""

    def __init__(
        self, gates: torch.Tensor, peak_of: tuple[Any, ...] | None, late: Any = None
    ) -> None:
        self._peak = None if peak_of is None and late is None else 0.0

    def late_peak(self) -> None:
        return None  # the compressed kernel is not asked for max |q|

    def read(self) -> float | None:
        return self._peak


def _read_first(*args: Any) -> validate.NSADims:
    return validate.check_nsa_args(*args, peak_abs=attention.needs_peak_abs(args[0]), defer=False)


def q_read_by_checks(*args: Any) -> validate.NSADims:
    """check_fast_args as up to `37b41f5`: the checks read q themselves (late_q off)."""
    return validate.check_nsa_args(
        *args, peak_abs=attention.needs_peak_abs(args[0]), defer=True, late_q=False
    )


MODES = ("start", "end", "end-q", "none")
_FAST = {"start": _read_first, "end-q": q_read_by_checks}


def _use(mode: str) -> None:
    validate.ValueChecks = _Trusted if mode == "none" else _CHECKS  # type: ignore[misc]
    attention.check_fast_args = _FAST.get(mode, _FAST_ARGS)


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
    for name in MODES:  # warm-up: compile and autotune once, same output
        _use(name)
        for _ in range(3):
            outs[name] = nsa_attention(q, k, v, gates, cfg)
    torch.cuda.synchronize()
    assert all(torch.equal(outs["end"], o) for o in outs.values()), "the modes disagree"

    ev: dict[str, list[float]] = {n: [] for n in MODES}
    wall: dict[str, list[float]] = {n: [] for n in MODES}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.rounds):
        for name in MODES:
            _use(name)
            w0 = time.perf_counter()
            start.record()
            nsa_attention(q, k, v, gates, cfg)
            end.record()
            end.synchronize()
            wall[name].append(1e3 * (time.perf_counter() - w0))
            ev[name].append(start.elapsed_time(end))
    _use("end")

    print(
        f"# nsa_call_overhead.py, commit {commit()}, {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}, T {t}, Hq {hq} / Hkv {hkv}, D {d}, bf16, paper config, "
        f"{args.rounds} rounds"
    )
    print(
        "| check | event ms, median (p10-p90) | host wall ms, median | of `none`, paired median |"
    )
    print("|---|---|---|---|")
    for name in MODES:
        paired = paired_median(ev[name], ev["none"])
        print(
            f"| {name} | {spread(ev[name], 3)} "
            f"| {statistics.median(wall[name]):.3f} | {paired:.4f} |"
        )


if __name__ == "__main__":
    main()
