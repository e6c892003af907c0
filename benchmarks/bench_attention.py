"""Forward speed of block_attention vs PyTorch SDPA (flash, cuDNN) and compiled FlexAttention,
and of the simulated ring (one GPU) vs one flash call. Prints a table last.

    python benchmarks/bench_attention.py            # H200: full set
    python benchmarks/bench_attention.py --quick    # smaller sizes, no FlexAttention
    python benchmarks/bench_attention.py --only-ring --worlds 4   # the simulated ring alone

FLOPs: 4·B·H·Sq·Sk·D (half if causal), median CUDA-event time (triton.testing.do_bench).
Our Triton kernel is timed in both load paths (TMA descriptors on sm_90 and plain pointers), and
on Hopper our Gluon kernel (kernels/attention/gluon_fwd.py), which block_attention runs there.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from benchmarks._common import commit  # noqa: E402
from kernels.attention import block_attention  # noqa: E402
from kernels.attention.backends import resolve_backend  # noqa: E402
from kernels.attention.block_attention import (  # noqa: E402
    _TMA_BEST,
    _block_attention_fwd_tuned,
    block_attention_triton,
)
from kernels.attention.gluon_fwd import block_attention_gluon, gluon_unsupported  # noqa: E402
from kernels.ring import ring_attention, shard  # noqa: E402
from kernels.ring.simulate import rank_forward  # noqa: E402

ROWS: list[tuple[str, str, float, float | None]] = []  # (section, name, ms, TFLOP/s)


def bench(fn, warmup: int = 25, rep: int = 100) -> float:
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def flops(b: int, h: int, sq: int, sk: int, d: int, causal: bool) -> float:
    return 4.0 * b * h * sq * sk * d * (0.5 if causal else 1.0)


def record(section: str, name: str, ms: float, fl: float | None) -> None:
    tf = fl / ms / 1e9 if fl else None
    ROWS.append((section, name, ms, tf))
    print(
        f"{section:<34} {name:<34} {ms:9.3f} ms  {'' if tf is None else f'{tf:7.1f} TFLOP/s'}",
        flush=True,
    )


def sdpa(backend: SDPBackend, q, k, v, causal: bool):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def kernel_section(
    b: int, s: int, h: int, d: int, causal: bool, with_flex: bool, only_flex: bool = False
) -> None:
    sec = f"B{b} S{s} H{h} D{d} {'causal' if causal else 'full'}"
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(b, s, h, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3)
    )
    fl = flops(b, h, s, s, d, causal)
    ref = None
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, S, D] views
    for name, tma in (
        () if only_flex else (("ours triton (tma)", True), ("ours triton (ptr)", False))
    ):
        try:
            fn = lambda tma=tma: block_attention_triton(
                q, k, v, causal=causal, scale=d**-0.5, use_tma=tma
            )
            out, _ = fn()
            record(sec, name, bench(fn), fl)
            ref = out if ref is None else ref
        except Exception as exc:  # report and keep going: one broken path must not hide the rest
            print(f"{sec}: {name} failed: {exc!r}", flush=True)
    if not only_flex and gluon_unsupported(q, k, v, causal=causal, q_offset=0, k_offset=0) is None:
        try:  # what block_attention runs on Hopper
            fn = lambda: block_attention_gluon(q, k, v, causal=causal)
            fn()
            record(sec, "ours gluon", bench(fn), fl)
        except Exception as exc:
            print(f"{sec}: ours gluon failed: {exc!r}", flush=True)
    for name, be in (
        ()
        if only_flex
        else (
            ("sdpa flash", SDPBackend.FLASH_ATTENTION),
            ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION),
        )
    ):
        try:
            o = sdpa(be, qt, kt, vt, causal)
            if ref is not None:
                err = ((o.transpose(1, 2).float() - ref.float()).norm() / o.float().norm()).item()
                print(f"  {name} vs ours rel diff {err:.2e}")
            record(sec, name, bench(lambda be=be: sdpa(be, qt, kt, vt, causal)), fl)
        except Exception as exc:
            print(f"{sec}: {name} failed: {exc!r}", flush=True)
    if with_flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            t0 = time.time()
            flex = torch.compile(flex_attention, dynamic=False)
            mask = None
            if causal:
                mask = create_block_mask(
                    lambda b_, h_, qi, ki: qi >= ki, None, None, s, s, device="cuda"
                )
            fn = lambda: flex(qt, kt, vt, block_mask=mask)
            fn()
            torch.cuda.synchronize()
            print(f"  flex compile {time.time() - t0:.1f} s")
            record(sec, "flex (compiled)", bench(fn), fl)
        except Exception as exc:
            print(f"{sec}: flex failed: {exc!r}", flush=True)


def ring_section(t: int, h: int, d: int, worlds: list[int], backends: list[str]) -> None:
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (
        torch.randn(1, t, h, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3)
    )
    fl = flops(1, h, t, t, d, True)
    sec = f"ring sim T{t} H{h} D{d} causal"
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    flash_ms = bench(lambda: sdpa(SDPBackend.FLASH_ATTENTION, qt, kt, vt, True), 10, 200)
    record(sec, "one call: sdpa flash", flash_ms, fl)
    record(
        sec,
        "one call: sdpa cudnn",
        bench(lambda: sdpa(SDPBackend.CUDNN_ATTENTION, qt, kt, vt, True), 10, 200),
        fl,
    )
    record(sec, "one call: ours", bench(lambda: block_attention(q, k, v, causal=True), 10, 200), fl)
    for requested in backends:
        backend = resolve_backend(requested, q)  # rank_forward takes a resolved block kernel
        for p in worlds:
            for layout in ("contiguous", "zigzag"):
                name = f"P{p} {layout} [{requested}->{backend}]"
                try:
                    total = bench(
                        partial(
                            ring_attention,
                            q,
                            k,
                            v,
                            causal=True,
                            world_size=p,
                            layout=layout,
                            backend=backend,
                        ),
                        10,
                        300,
                    )
                    qs = [shard(q, r, p, layout) for r in range(p)]
                    ks = [shard(k, r, p, layout) for r in range(p)]
                    vs = [shard(v, r, p, layout) for r in range(p)]
                    per_rank = [
                        bench(
                            partial(
                                rank_forward,
                                qs[r],
                                ks,
                                vs,
                                rank=r,
                                causal=True,
                                layout=layout,
                                scale=d**-0.5,
                                backend=backend,
                            ),
                            5,
                            100,
                        )
                        for r in range(p)
                    ]
                    record(sec, name + " total", total, fl)
                    record(sec, name + " max rank x P", max(per_rank) * p, fl)
                    print(
                        f"  {name}: total/flash = {total / flash_ms:.3f}, sum ranks {sum(per_rank):.2f} ms, max rank {max(per_rank):.2f} ms"
                    )
                except Exception as exc:
                    print(f"{sec}: {name} failed: {exc!r}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, no FlexAttention")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-ring", action="store_true")
    ap.add_argument("--only-ring", action="store_true", help="the simulated ring section alone")
    ap.add_argument("--worlds", type=int, nargs="+", help="ring sizes (default 4 8)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("CUDA is not available: this benchmark needs a GPU")
        return
    print(
        f"commit {commit()}; torch {torch.__version__}, triton {triton.__version__}, "
        f"{torch.cuda.get_device_name()}",
        flush=True,
    )
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/inductor")
    if args.quick:
        shapes = [(2, 4096, 16, 128)]
        ring = (16384, 16, 128, [4])
    else:
        # T >= 8k at D 128 (issue 19's goal), and D 64 and 96 for the table.
        shapes = [(2, 8192, 16, 128), (1, 16384, 16, 128), (2, 8192, 16, 64), (2, 8192, 16, 96)]
        ring = (65536, 16, 128, [4, 8])
    for b, s, h, d in [] if args.only_ring else shapes:
        for causal in (False, True):
            kernel_section(b, s, h, d, causal, with_flex=False)
    print("TMA configs chosen:", _TMA_BEST, flush=True)
    tuned = getattr(_block_attention_fwd_tuned, "cache", {})
    print("pointer-path configs chosen:", {k[:4]: str(v) for k, v in tuned.items()}, flush=True)
    if not args.no_ring:
        t, h, d, worlds = ring
        ring_section(t, h, d, args.worlds or worlds, ["triton", "auto"])
    if not (args.quick or args.no_flex or args.only_ring):
        # Last: compiling FlexAttention takes tens of seconds per shape.
        b, s, h, d = shapes[1]
        for causal in (False, True):
            kernel_section(b, s, h, d, causal, with_flex=True, only_flex=True)

    # Time-equivalent ratio to cuDNN in the same section (its ms over ours; above 1 is faster).
    cudnn = {sec: ms for sec, name, ms, _ in ROWS if name == "sdpa cudnn"}
    print("\n| section | kernel | ms | TFLOP/s | of cuDNN |\n|---|---|---|---|---|")
    for sec, name, ms, tf in ROWS:
        ratio = f"{cudnn[sec] / ms:.3f}" if sec in cudnn else ""
        print(f"| {sec} | {name} | {ms:.3f} | {'' if tf is None else f'{tf:.1f}'} | {ratio} |")


if __name__ == "__main__":
    main()
