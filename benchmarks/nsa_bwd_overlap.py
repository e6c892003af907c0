"""Does the NSA backward gain from its side stream? (issue 19: fwd+bwd at 64k ≤ 120 ms)

``kernels.nsa.backward.SIDE_STREAM`` runs the compressed branch's dk̃/dṽ kernel, which needs
nothing but the forward's tensors and D, on a side stream (``kernels.nsa._streams``) beside the
ordered chain window → selection → compressed dq. This script times the no-grad forward (a
control: the switch must not move it) and the training step both ways, round-robin (one call
of each per round, so clock drift hits both alike), on identical inputs, after checking that
both give the same outputs and gradients:

- ``serial``: every backward kernel on the caller's stream, one after another;
- ``side``: the compressed dk̃/dṽ kernel on the side stream (the default).

Run 63 also put the forward's value checks on the side stream: no gain (1.00 of the serial
forward at 64k, 1.014 at 16k), so they stay on the caller's stream.

    python benchmarks/nsa_bwd_overlap.py                       # 16k and 64k, paper config
    python benchmarks/nsa_bwd_overlap.py --seqs 65536 --rounds 20
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

os.environ.setdefault("NSA_AUTOTUNE", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.nsa.backward as backward  # noqa: E402
from benchmarks._common import (  # noqa: E402
    commit,
    diff,
    nsa_inputs,
    paired_median,
    round_robin_args,
    spread,
)
from kernels.nsa import NSAConfig, nsa_attention  # noqa: E402

MODES = {"serial": False, "side": True}


def _use(mode: str) -> None:
    backward.SIDE_STREAM = MODES[mode]


def main() -> None:
    args = round_robin_args(__doc__, [16384, 65536])
    cfg = NSAConfig()
    print(
        f"# nsa_bwd_overlap.py, commit {commit()}, {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}, Hq {args.hq} / Hkv {args.hkv}, D {args.dim}, bf16, "
        f"paper config, {args.rounds} rounds"
    )
    print(
        "| T | mode | fwd ms, median (p10-p90) | of serial, paired "
        "| fwd+bwd ms, median (p10-p90) | of serial, paired |"
    )
    print("|---|---|---|---|---|---|")
    for t in args.seqs:
        one(t, args.hq, args.hkv, args.dim, args.rounds, cfg)
        torch.cuda.empty_cache()


def one(t: int, hq: int, hkv: int, dim: int, rounds: int, cfg: NSAConfig) -> None:
    """The table's rows at length t (a function: its tensors are freed on return)."""
    q, k, v, gates, dout = nsa_inputs(t, hq, hkv, dim, "cuda", with_dout=True)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, gates)]
    outs, grads = {}, {}
    for mode in MODES:  # warm-up: compile once; the results compared
        _use(mode)
        for _ in range(2):
            with torch.no_grad():
                outs[mode] = nsa_attention(q, k, v, gates, cfg)
            grads[mode] = torch.autograd.grad(nsa_attention(*leaves, cfg), leaves, dout)
    torch.cuda.synchronize()
    for mode in MODES:
        assert torch.equal(outs[mode], outs["serial"]), f"{mode}: the forward differs"
        for name, a, b in zip(
            ("dq", "dk", "dv", "dgates"), grads[mode], grads["serial"], strict=True
        ):
            print(f"#   T {t} {name}: {mode} vs serial {diff(a, b)}")
    del outs, grads

    fw: dict[str, list[float]] = {m: [] for m in MODES}
    fb: dict[str, list[float]] = {m: [] for m in MODES}
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(rounds):
        for mode in MODES:
            _use(mode)
            e0.record()
            with torch.no_grad():
                nsa_attention(q, k, v, gates, cfg)
            e1.record()
            e1.synchronize()
            fw[mode].append(e0.elapsed_time(e1))
            e0.record()
            torch.autograd.grad(nsa_attention(*leaves, cfg), leaves, dout)
            e1.record()
            e1.synchronize()
            fb[mode].append(e0.elapsed_time(e1))
    _use("side")

    def cell(xs: list[float], base: list[float]) -> str:
        return f"{spread(xs)} | {paired_median(xs, base):.4f}"

    for mode in MODES:
        print(f"| {t} | {mode} | {cell(fw[mode], fw['serial'])} | {cell(fb[mode], fb['serial'])} |")


if __name__ == "__main__":
    main()
