"""Sweep block_attention's launch configurations and kernel variants against cuDNN on one GPU.

    python benchmarks/sweep_attention.py                 # D=128, T 8k and 16k, full and causal
    python benchmarks/sweep_attention.py --top 8 --jobs 8

Every variant (tile sizes, warps, stages, pointer or TMA loads, the kernel's ``split``, ``lazy``
and ``warp_specialize`` options) is compiled first by ``--jobs`` processes in parallel (Triton's
on-disk cache), then timed one after another in this process against cuDNN SDPA on the same
inputs (median CUDA-event time, ``triton.testing.do_bench``). A variant that fails to compile or
disagrees with cuDNN is reported, not timed. Prints, per shape, the best variants and their
ratio to cuDNN's TFLOP/s.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import sys
from functools import partial
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from benchmarks._common import commit  # noqa: E402
from kernels.attention.block_attention import block_attention_triton  # noqa: E402


class Variant(NamedTuple):
    bm: int
    bn: int
    warps: int
    stages: int
    tma: bool
    split: bool
    lazy: bool
    ws: bool

    def label(self) -> str:
        opts = [o for o, on in (("split", self.split), ("lazy", self.lazy), ("ws", self.ws)) if on]
        path = "tma" if self.tma else "ptr"
        return f"{self.bm}x{self.bn} w{self.warps} s{self.stages} {path} {'+'.join(opts) or '-'}"


TILES_128 = [(128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 4, 4)]
TILES_256 = [(256, 64, 8, 2), (256, 64, 8, 3), (256, 128, 8, 2)]  # two halves of 128 rows


def variants() -> list[Variant]:
    out = []
    for (bm, bn, w, s), tma, split, lazy in itertools.product(
        TILES_128, (False, True), (False, True), (False, True)
    ):
        out.append(Variant(bm, bn, w, s, tma, split, lazy, False))
    for (bm, bn, w, s), tma, lazy in itertools.product(TILES_256, (False, True), (False, True)):
        out.append(Variant(bm, bn, w, s, tma, True, lazy, False))
    for (bm, bn, w, s), lazy in itertools.product(TILES_128, (False, True)):
        out.append(Variant(bm, bn, w, s, True, False, lazy, True))
    return out


def variants_split() -> list[Variant]:
    """Round two (after the first sweep: split won on full attention, warp specialisation on
    causal): split tiles with TMA and warp specialisation, more stages, narrower key tiles."""
    tiles = [(256, 64, 8, 2), (256, 64, 8, 3), (256, 64, 8, 4), (256, 32, 8, 3), (256, 32, 8, 4)]
    out = [
        Variant(*t, tma, True, False, ws)
        for t in tiles
        for tma, ws in ((False, False), (True, False), (True, True))
    ]
    out += [Variant(128, 128, 8, s, True, False, False, True) for s in (2, 3, 4)]
    out += [Variant(128, 128, 8, 3, False, False, False, False)]
    return out


def run(v: Variant, q, k, v_, causal: bool):
    d = q.shape[-1]
    return block_attention_triton(
        q,
        k,
        v_,
        causal=causal,
        scale=d**-0.5,
        block_m=v.bm,
        block_n=v.bn,
        num_warps=v.warps,
        num_stages=v.stages,
        use_tma=v.tma,
        split=v.split,
        lazy=v.lazy,
        warp_specialize=v.ws,
    )


def inputs(b: int, s: int, h: int, d: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [
        torch.randn(b, s, h, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3)
    ]


def _compile_some(args: tuple[list[Variant], int, list[bool]]) -> list[tuple[Variant, bool, str]]:
    chunk, d, causals = args
    q, k, v = inputs(1, 1024, 16, d)
    failed = []
    for var in chunk:
        for causal in causals:
            try:
                run(var, q, k, v, causal)
                torch.cuda.synchronize()
            except Exception as exc:  # reported by the timing pass too
                failed.append((var, causal, repr(exc)[:160]))
    return failed


def time_shape(b: int, s: int, d: int, causal: bool, vs: list[Variant], top: int) -> None:
    q, k, v = inputs(b, s, 16, d, seed=s)
    fl = 4.0 * b * 16 * s * s * d * (0.5 if causal else 1.0)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, S, D]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
        cudnn_ms = triton.testing.do_bench(
            partial(F.scaled_dot_product_attention, qt, kt, vt, is_causal=causal),
            warmup=10,
            rep=100,
        )
    cudnn_tf = fl / cudnn_ms / 1e9
    rows = []
    for var in vs:
        try:
            out, _ = run(var, q, k, v, causal)
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            if not err < 2e-2:
                print(f"  {var.label()}: rel diff {err:.2e} against cuDNN", flush=True)
                continue
            ms = triton.testing.do_bench(partial(run, var, q, k, v, causal), warmup=10, rep=60)
            rows.append((ms, var))
        except Exception as exc:
            print(f"  {var.label()}: {exc!r}"[:200], flush=True)
    rows.sort()
    print(f"\nB{b} S{s} H16 D{d} {'causal' if causal else 'full'}: cuDNN {cudnn_ms:.3f} ms")
    print("| variant | ms | TFLOP/s | of cuDNN |\n|---|---|---|---|")
    print(f"| cuDNN SDPA | {cudnn_ms:.3f} | {cudnn_tf:.0f} | 1.000 |")
    usual = Variant(128, 128, 8, 3, False, False, False, False)
    shown = rows[:top] + [r for r in rows[top:] if r[1] == usual]
    for ms, var in shown:
        tf = fl / ms / 1e9
        note = " (today's usual pick)" if var == usual else ""
        print(f"| {var.label()}{note} | {ms:.3f} | {tf:.0f} | {tf / cudnn_tf:.3f} |")
    print(flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=8, help="parallel compile processes")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--dims", type=int, nargs="+", default=[128])
    ap.add_argument("--shapes", default="2x8192,1x16384", help="BxT list, H=16")
    ap.add_argument("--set", choices=["all", "split"], default="all", help="which variants")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("CUDA is not available: this sweep needs a GPU")
        return
    print(f"commit {commit()}; torch {torch.__version__}; triton {triton.__version__}", flush=True)
    vs = variants() if args.set == "all" else variants_split()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    ctx = mp.get_context("spawn")
    for d in args.dims:
        chunks = [vs[i :: args.jobs] for i in range(args.jobs)]
        with ctx.Pool(args.jobs) as pool:
            failed = [
                f
                for part in pool.map(_compile_some, [(c, d, [False, True]) for c in chunks])
                for f in part
            ]
        for var, causal, err in failed:
            print(f"D{d} {'causal' if causal else 'full'} {var.label()}: failed {err}", flush=True)
        bad = {(var, causal) for var, causal, _ in failed}
        for (b, s), causal in itertools.product(shapes, (False, True)):
            time_shape(b, s, d, causal, [v for v in vs if (v, causal) not in bad], args.top)


if __name__ == "__main__":
    main()
