"""NSA forward benchmark, paper configuration (spec §6/§7): B=1, Hq=64, Hkv=4, D=128, bf16.

Times our ``nsa_attention`` (three branches + gates) with a per-branch breakdown beside dense
causal SDPA (cuDNN and flash backends) and, if it compiles, FlexAttention with a 512-token
sliding window. Median CUDA-event times (triton.testing.do_bench) after warm-up, over at least
10 calls (``_common.median_ms``); TFLOP/s use effective FLOPs (spec §6: only visited keys).
Prints a table last.

    python benchmarks/bench_nsa.py [--seqs 16384 32768 65536] [--no-flex]

``--variants`` instead compares the kernel variants (kernels.nsa.attention.VARIANTS) on
identical inputs at T=32k and 64k: per-branch times, the total forward of every
(selection, compressed) combination, and each variant's outputs against v1's:

    python benchmarks/bench_nsa.py --variants [--seqs 32768 65536] [--autotune --tune-max 2]

``--backward`` times training instead: the no-grad forward, the forward that keeps what the
backward needs, forward + backward (``torch.autograd.grad`` w.r.t. q, k, v, gates), and a
per-branch breakdown of the backward kernels, beside dense causal SDPA cuDNN fwd+bwd:

    python benchmarks/bench_nsa.py --backward [--seqs 16384 32768 65536] [--autotune --tune-max 2]

``--device cpu`` with TRITON_INTERPRET=1 and a tiny shape (``--seqs 128 --hq 4 --hkv 1
--dim 16``) smoke-tests that mode without a GPU (wall-clock medians there, not CUDA events).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

# Before kernels are imported. Untuned by default: each kernel's first config, which is what
# nsa_attention runs (the tables before 2026-12-02 were tuned: 49.0 ms at 64k for an untuned
# 51.25). --autotune times the best of each kernel's configs instead.
os.environ.setdefault("NSA_AUTOTUNE", "1" if "--autotune" in sys.argv else "0")
if "--variants" in sys.argv or "--backward" in sys.argv:
    # bound compile time (< 5 min in all): each kernel tunes over its first k configs only
    _k = sys.argv[sys.argv.index("--tune-max") + 1] if "--tune-max" in sys.argv else "2"
    os.environ.setdefault("NSA_AUTOTUNE_MAX", _k)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402

import kernels.nsa.attention as nsa_mod  # noqa: E402
from benchmarks._common import commit, device_ready, diff, median_ms, nsa_inputs  # noqa: E402
from kernels.nsa import NSAConfig, nsa_attention  # noqa: E402
from kernels.nsa.attention import _split_fp16  # noqa: E402
from kernels.nsa.compressed import COMPRESSED_IMPLS, compressed_triton  # noqa: E402
from kernels.nsa.config import num_cmp_blocks  # noqa: E402
from kernels.nsa.selection import (  # noqa: E402
    SELECTION_IMPLS,
    selection_triton,
    selection_triton_v2,
    union_blocks,
)
from kernels.nsa.topn import TOPN_FORMS, topn_triton  # noqa: E402
from kernels.nsa.torch_path import compress_mean_fast  # noqa: E402
from kernels.nsa.window import WINDOW_IMPLS, window_triton  # noqa: E402

B, HQ, HKV, D = 1, 64, 4, 128


def bench(fn: Callable[[], object]) -> float:
    return median_ms(fn, cuda=True)


def flops(t: int, cfg: NSAConfig) -> dict[str, float]:
    """Effective forward FLOPs (4·Hq·D per visited query-key pair, spec §6)."""
    pos = torch.arange(t, dtype=torch.float64)
    per_pair = 4.0 * B * HQ * D
    nvis = torch.clamp((pos + 1 - cfg.cmp_block) // cfg.cmp_stride + 1, min=0)
    cmp_pairs = float(torch.clamp(nvis, max=num_cmp_blocks(t, cfg)).sum())
    slc_pairs = float(t) * cfg.sel_count * cfg.sel_block  # spec: T·(n·l′)
    win_pairs = float(torch.clamp(pos + 1, max=cfg.window).sum())
    dense = t * (t + 1) / 2.0
    return {
        "cmp": per_pair * cmp_pairs,
        "slc": per_pair * slc_pairs,
        "win": per_pair * win_pairs,
        "dense": per_pair * dense,
    }


def run_one(t: int, use_flex: bool) -> list[tuple[str, float, float | None]]:
    cfg = NSAConfig()
    dev = "cuda"
    q, k, v, gates = nsa_inputs(t, HQ, HKV, D, dev)
    scale = D**-0.5
    fl = flops(t, cfg)
    rows: list[tuple[str, float, float | None]] = []

    def add(name: str, ms: float, fl_: float | None) -> None:
        tf = fl_ / (ms * 1e-3) / 1e12 if fl_ else None
        rows.append((name, ms, tf))
        print(f"  T={t:6d} {name:28s} {ms:9.3f} ms" + (f" {tf:7.1f} TFLOP/s" if tf else ""))

    def attempt(name: str, fn: Callable[[], object], fl_: float | None) -> None:
        try:
            fn()
            torch.cuda.synchronize()
            add(name, bench(fn), fl_)
        except Exception as exc:  # keep going: one failing baseline must not hide the rest
            print(f"  T={t:6d} {name}: FAILED {type(exc).__name__}: {exc}")
            traceback.print_exc(limit=3)

    # as the reference does for bf16 inputs: k̃ in fp32, split into fp16 hi + lo; ṽ in fp16
    kc, kc_lo = _split_fp16(compress_mean_fast(k, cfg, torch.float32))
    vc = compress_mean_fast(v, cfg, torch.float16)
    attempt(
        "nsa compress (mean, k+v)",
        lambda: (
            _split_fp16(compress_mean_fast(k, cfg, torch.float32)),
            compress_mean_fast(v, cfg, torch.float16),
        ),
        None,
    )
    # the branches as nsa_attention runs them: its default kernel variants, its output dtype
    cmp_fn = COMPRESSED_IMPLS[nsa_mod.variant("compressed")]
    slc_fn = SELECTION_IMPLS[nsa_mod.variant("selection")]
    o_dt = nsa_mod.branch_dtype(kc.dtype)
    form = nsa_mod.variant("topn")
    attempt(
        "nsa cmp attn+scores+top-n",
        lambda: cmp_fn(q, kc, vc, cfg, scale, True, kc_lo=kc_lo, out_dtype=o_dt, topn_form=form),
        fl["cmp"],
    )
    attempt(
        "nsa cmp attn only",
        lambda: cmp_fn(q, kc, vc, cfg, scale, False, kc_lo=kc_lo, out_dtype=o_dt),
        fl["cmp"],
    )
    o_cmp, _, idx = cmp_fn(q, kc, vc, cfg, scale, True, kc_lo=kc_lo, out_dtype=o_dt)
    assert idx is not None

    def selection() -> tuple[torch.Tensor, torch.Tensor]:
        return slc_fn(q, k, v, idx, cfg, scale, torch.empty, o_dt)

    attempt("nsa selection", selection, fl["slc"])
    o_slc, _ = selection()
    attempt("nsa window", lambda: window_triton(q, k, v, cfg.window, scale), fl["win"])
    attempt(
        "nsa window+combine",
        lambda: window_triton(q, k, v, cfg.window, scale, combine=(o_cmp, o_slc, gates)),
        fl["win"],
    )
    total_fl = fl["cmp"] + fl["slc"] + fl["win"]
    attempt("nsa total fwd", lambda: nsa_attention(q, k, v, gates, cfg), total_fl)

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    qh = q.transpose(1, 2)  # [B, Hq, T, D]
    kh = k.repeat_interleave(HQ // HKV, dim=2).transpose(1, 2)  # GQA expanded
    vh = v.repeat_interleave(HQ // HKV, dim=2).transpose(1, 2)
    for name, backend in (
        ("cuDNN", SDPBackend.CUDNN_ATTENTION),
        ("flash", SDPBackend.FLASH_ATTENTION),
    ):

        def dense(backend: SDPBackend = backend) -> torch.Tensor:
            with sdpa_kernel(backend):
                return sdpa(qh, kh, vh, is_causal=True)

        attempt(f"dense causal SDPA {name}", dense, fl["dense"])
    if use_flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            w = cfg.window

            def sliding(b: object, h: object, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
                return (qi >= ki) & (qi - ki < w)

            mask = create_block_mask(sliding, None, None, t, t, device=dev)
            flex = torch.compile(flex_attention)
            attempt(
                "flex sliding window 512",
                lambda: flex(qh, kh, vh, block_mask=mask),
                fl["win"],
            )
        except Exception as exc:
            print(f"  flex unavailable: {type(exc).__name__}: {exc}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=None)
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--variants", action="store_true", help="compare kernel variants")
    ap.add_argument("--sel", nargs="+", default=list(SEL_VARIANTS), help="selection variants")
    ap.add_argument("--cmp", nargs="+", default=list(COMPRESSED_IMPLS), help="cmp variants")
    ap.add_argument("--win", nargs="+", default=["v1"], help="window variants (v1, g1)")
    ap.add_argument(
        "--autotune",
        action="store_true",
        help="tune each kernel over its configs (default: the first config, as nsa_attention runs)",
    )
    ap.add_argument(
        "--tune-max", type=int, default=2, help="with --autotune: configs tuned per kernel"
    )
    ap.add_argument("--backward", action="store_true", help="time forward + backward")
    ap.add_argument("--device", default="cuda", help="--backward: cpu needs TRITON_INTERPRET=1")
    ap.add_argument("--hq", type=int, default=HQ, help="--backward: query heads")
    ap.add_argument("--hkv", type=int, default=HKV, help="--backward: KV heads")
    ap.add_argument("--dim", type=int, default=D, help="--backward: head dim")
    args = ap.parse_args()
    print("command: PYTHONUNBUFFERED=1 python3 " + " ".join(sys.argv))
    print(f"commit {commit()}; NSA_AUTOTUNE={os.environ.get('NSA_AUTOTUNE')}")
    if args.backward:
        run_backward(args.seqs or [16384, 32768, 65536], args.device, args.hq, args.hkv, args.dim)
        return
    if not torch.cuda.is_available():
        print("bench_nsa: needs CUDA")
        return
    if args.variants:
        run_variants(args.seqs or [32768, 65536], args.sel, args.cmp, args.win)
        return
    args.seqs = args.seqs or [16384, 32768, 65536]
    print(
        f"device {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}"
    )
    results: dict[int, dict[str, tuple[float, float | None]]] = {}
    for t in args.seqs:
        rows = run_one(t, use_flex=not args.no_flex)
        torch.cuda.empty_cache()  # run_one's tensors are gone; hand their memory back
        results[t] = {name: (ms, tf) for name, ms, tf in rows}
    print_best_configs(
        ("kernels.nsa.compressed", "nsa_compressed_fwd_kernel_v2"),
        ("kernels.nsa.selection", "nsa_selection_fwd_kernel_v2"),
        ("kernels.nsa.window", "nsa_window_fwd_kernel"),
    )
    variants = (
        f"selection {nsa_mod.variant('selection')}, compressed {nsa_mod.variant('compressed')}"
    )
    print(
        f"\n## NSA fwd, B=1 Hq=64 Hkv=4 D=128 bf16, paper config ({variants}); ms (effective "
        f"TFLOP/s); commit {commit()}"
    )
    names = sorted({n for r in results.values() for n in r}, key=_order)
    header = "| kernel | " + " | ".join(f"T={t // 1024}k" for t in args.seqs) + " | goal |"
    print(header)
    print("|" + "---|" * (len(args.seqs) + 2))
    for name in names:
        cells = []
        for t in args.seqs:
            ms_tf = results[t].get(name)
            if ms_tf is None:
                cells.append("—")
            else:
                ms, tf = ms_tf
                cells.append(f"{ms:.2f}" + (f" ({tf:.0f})" if tf else ""))
        print(f"| {name} | " + " | ".join(cells) + f" | {_goal(name)} |")
    for t in args.seqs:
        r = results[t]
        if "nsa total fwd" not in r:
            continue
        tot = r["nsa total fwd"][0]
        parts = [f"T={t // 1024}k: total {tot:.2f} ms"]
        for base in ("dense causal SDPA cuDNN", "dense causal SDPA flash"):
            if base in r:
                parts.append(f"{base.split()[-1]} {r[base][0]:.2f} ms → {r[base][0] / tot:.2f}×")
        parts.append(f"vs 35 ms goal: {tot / 35.0:.2f}× of budget")
        print("  " + "; ".join(parts))


# ---- variant comparison (--variants) --------------------------------------------------------

# selection variant label → (implementation name, positions per program for v3)
SEL_VARIANTS: dict[str, tuple[str, int | None]] = {
    "v1": ("v1", None),
    "v2": ("v2", None),
    "v3r2": ("v3", 2),
    "v3r4": ("v3", 4),
    # the forced blocks in the window kernel: its "slc" row also runs that kernel (the
    # selection alone cannot run without it); the "total fwd" rows are the ones to compare
    "v5": ("v5", None),
}


def _set_sel(label: str) -> None:
    name, r = SEL_VARIANTS[label]
    nsa_mod.VARIANTS["selection"] = name
    if r is None:
        os.environ.pop("KGRADE_NSA_SELECTION_R", None)
    else:
        os.environ["KGRADE_NSA_SELECTION_R"] = str(r)


def _sel_fn(label: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    name, r = SEL_VARIANTS[label]
    if r is None:
        return SELECTION_IMPLS[name]  # type: ignore[return-value]
    return lambda q, k, v, idx, cfg, scale: selection_triton_v2(
        q, k, v, idx, cfg, scale, torch.empty, positions=r
    )


def run_variants(seqs: list[int], sel: list[str], cmp: list[str], win: list[str]) -> None:
    """One table: per-branch and total times of every variant, outputs checked against v1."""
    cfg = NSAConfig()
    scale = D**-0.5
    table: list[tuple[str, str, dict[int, str]]] = []  # (row, check vs v1, T → cell)

    def put(row: str, t: int, text: str, check: str = "") -> None:
        for i, (name, _chk, cells) in enumerate(table):
            if name == row:
                cells[t] = text
                if check and t == seqs[-1]:
                    table[i] = (name, check, cells)
                return
        table.append((row, check, {t: text}))

    def cell(row: str, t: int, ms: float | None, fl_: float | None, check: str = "") -> None:
        text = "FAILED" if ms is None else f"{ms:.2f}" + (f" ({fl_ / ms / 1e9:.0f})" if fl_ else "")
        put(row, t, text, check)

    def timed(row: str, t: int, fn: Callable[[], object], fl_: float | None) -> float | None:
        try:
            fn()
            torch.cuda.synchronize()
            ms = bench(fn)
        except Exception as exc:  # a broken variant must not hide the others
            print(f"  T={t:6d} {row}: FAILED {type(exc).__name__}: {exc}")
            traceback.print_exc(limit=4)
            ms = None
        print(f"  T={t:6d} {row:40s} " + ("FAILED" if ms is None else f"{ms:9.3f} ms"))
        return ms

    def one(t: int) -> None:  # a function: its tensors are freed on return
        gen = torch.Generator(device="cuda").manual_seed(t)
        q, k, v, gates = nsa_inputs(t, HQ, HKV, D, "cuda", gen=gen)
        # "local" queries: 64-position chunks share 80 % of their query direction, as
        # neighbouring tokens of a real model do, so their top-n sets overlap
        base = torch.randn(B, -(-t // 64), HQ, D, device="cuda", generator=gen)
        noise = torch.randn(B, t, HQ, D, device="cuda", generator=gen)
        q_loc = (0.8**0.5 * base.repeat_interleave(64, 1)[:, :t] + 0.2**0.5 * noise).to(q.dtype)
        fl = flops(t, cfg)
        kc, kc_lo = _split_fp16(compress_mean_fast(k, cfg, torch.float32))
        vc = compress_mean_fast(v, cfg, torch.float16)

        # compressed branch
        ref_c = compressed_triton(q, kc, vc, cfg, scale, True, kc_lo=kc_lo)
        assert ref_c[2] is not None
        idx = ref_c[2]
        for name in cmp:
            fn = COMPRESSED_IMPLS[name]
            ms = timed(
                f"cmp {name} attn+scores+top-n",
                t,
                lambda fn=fn: fn(q, kc, vc, cfg, scale, True, kc_lo=kc_lo),
                fl["cmp"],
            )
            check = ""
            try:
                o, lse, ix = fn(q, kc, vc, cfg, scale, True, kc_lo=kc_lo)
                assert ix is not None
                same = float((ix == idx).all(-1).float().mean())
                check = f"o_cmp {diff(o, ref_c[0])}; lse {diff(lse, ref_c[1])}; idx same {same:.5f}"
            except Exception as exc:
                check = f"FAILED {type(exc).__name__}"
            cell(f"cmp {name} attn+scores+top-n", t, ms, fl["cmp"], check)
            ms = timed(
                f"cmp {name} attn only",
                t,
                lambda fn=fn: fn(q, kc, vc, cfg, scale, False, kc_lo=kc_lo),
                fl["cmp"],
            )
            cell(f"cmp {name} attn only", t, ms, fl["cmp"])
        ts = -(-t // cfg.sel_block)
        sa = torch.rand(B, HKV, t, ts, device="cuda", generator=gen)
        sb = torch.rand(B, HKV, t, ts, device="cuda", generator=gen)
        plain = topn_triton(sa, sb, t, HKV, cfg, banded=False, form="float16k")
        forms = [(False, "float16k", "top-n alone (incl. sort)")]
        forms += [(True, f, f"top-n alone, banded, {f}") for f in TOPN_FORMS]
        for banded, form, row in forms:
            kw = {"banded": banded, "form": form}
            ms = timed(row, t, lambda kw=kw: topn_triton(sa, sb, t, HKV, cfg, **kw), None)
            check = ""
            if banded:
                same = torch.equal(topn_triton(sa, sb, t, HKV, cfg, **kw), plain)
                check = f"picks equal: {same}"
            cell(row, t, ms, None, check)

        # selection branch, random and local queries (same indices for every variant)
        _, _, idx_loc = compressed_triton(q_loc, kc, vc, cfg, scale, True, kc_lo=kc_lo)
        assert idx_loc is not None
        for tag, qq, ii in (("", q, idx), (" [local q]", q_loc, idx_loc)):
            ref_s = selection_triton(qq, k, v, ii, cfg, scale)
            for r in (2, 4):
                cnt = union_blocks(ii, r)[1].float().mean().item()  # blocks per program
                put(f"mean union of {r} positions{tag} (of {r * cfg.sel_count})", t, f"{cnt:.1f}")
            for label in sel:
                fn = _sel_fn(label)
                row = f"slc {label}{tag}"
                ms = timed(
                    row, t, lambda fn=fn, qq=qq, ii=ii: fn(qq, k, v, ii, cfg, scale), fl["slc"]
                )
                try:
                    o, lse = fn(qq, k, v, ii, cfg, scale)
                    check = f"o_slc {diff(o, ref_s[0])}; lse {diff(lse, ref_s[1])}"
                except Exception as exc:
                    check = f"FAILED {type(exc).__name__}"
                cell(row, t, ms, fl["slc"], check)

        o_cmp, _, _ = ref_c
        o_slc, _ = selection_triton(q, k, v, idx, cfg, scale)
        ref_w = window_triton(q, k, v, cfg.window, scale, combine=(o_cmp, o_slc, gates))
        for wname in win:
            wfn = WINDOW_IMPLS[wname]
            row = f"window+combine {wname}"
            ms = timed(
                row,
                t,
                lambda wfn=wfn: wfn(q, k, v, cfg.window, scale, combine=(o_cmp, o_slc, gates)),
                fl["win"],
            )
            try:
                o, lse = wfn(q, k, v, cfg.window, scale, combine=(o_cmp, o_slc, gates))
                check = f"out {diff(o, ref_w[0])}; lse {diff(lse, ref_w[1])}"
            except Exception as exc:
                check = f"FAILED {type(exc).__name__}"
            cell(row, t, ms, fl["win"], check)

        # totals, every combination
        total_fl = fl["cmp"] + fl["slc"] + fl["win"]
        nsa_mod.VARIANTS.update(selection="v1", compressed="v1", window="v1")
        _set_sel("v1")
        ref_out = nsa_attention(q, k, v, gates, cfg)
        for cname in cmp:
            for label in sel:
                for wname in win:
                    _set_sel(label)
                    nsa_mod.VARIANTS.update(compressed=cname, window=wname)
                    row = f"total fwd slc {label} / cmp {cname} / win {wname}"
                    ms = timed(row, t, lambda: nsa_attention(q, k, v, gates, cfg), total_fl)
                    try:
                        check = "out " + diff(nsa_attention(q, k, v, gates, cfg), ref_out)
                    except Exception as exc:
                        check = f"FAILED {type(exc).__name__}"
                    cell(row, t, ms, total_fl, check)
        nsa_mod.VARIANTS.update(selection=None, compressed=None, window=None)
        os.environ.pop("KGRADE_NSA_SELECTION_R", None)

    for t in seqs:
        one(t)
        torch.cuda.empty_cache()

    print_best_configs(
        ("kernels.nsa.compressed", "nsa_compressed_fwd_kernel"),
        ("kernels.nsa.compressed", "nsa_compressed_fwd_kernel_v2"),
        ("kernels.nsa.selection", "nsa_selection_fwd_kernel"),
        ("kernels.nsa.selection", "nsa_selection_fwd_kernel_v2"),
        ("kernels.nsa.window", "nsa_window_fwd_kernel"),
    )
    print(
        f"\n## NSA fwd variants, B=1 Hq=64 Hkv=4 D=128 bf16, paper config; ms (effective "
        f"TFLOP/s); check = vs v1 at T={seqs[-1] // 1024}k"
    )
    print("goals @64k: total ≤ 35, cmp+scores+top-n ≤ 15, selection ≈ 10, window ≤ 5 ms")
    print("| row | " + " | ".join(f"T={t // 1024}k" for t in seqs) + " | check vs v1 |")
    print("|" + "---|" * (len(seqs) + 2))
    for name, chk, cells in table:
        print(f"| {name} | " + " | ".join(cells.get(t, "—") for t in seqs) + f" | {chk} |")


# ---- forward + backward (--backward) ---------------------------------------------------------


def print_best_configs(*kernels: tuple[str, str]) -> None:
    """The config autotuning kept for each (module, kernel) (its last tuned key)."""
    for mod, kern in kernels:
        fn = getattr(sys.modules[mod], kern)
        print(f"best config {kern}: {getattr(fn, 'best_config', None)}")


def run_backward(seqs: list[int], device: str, hq: int, hkv: int, dim: int) -> None:
    """One table: fwd (no grad), fwd keeping the backward's tensors, fwd+bwd, per-branch bwd."""
    from kernels.nsa._bwd_common import bwd_preprocess
    from kernels.nsa.attention import check_fast_args
    from kernels.nsa.backward import _forward_parts
    from kernels.nsa.compressed_bwd import compressed_bwd_triton
    from kernels.nsa.selection_bwd import selection_bwd_triton
    from kernels.nsa.window_bwd import window_bwd_triton

    cuda = device.startswith("cuda")
    if not device_ready(device, "bench_nsa --backward"):
        return

    cfg = NSAConfig()
    dtype = torch.bfloat16
    rows: dict[str, dict[int, str]] = {}

    def timed(row: str, t: int, fn: Callable[[], object]) -> float | None:
        try:
            fn()
            if cuda:
                torch.cuda.synchronize()
            ms: float | None = median_ms(fn, cuda)
            rows.setdefault(row, {})[t] = f"{ms:.2f}"
        except Exception as exc:  # one failure must not hide the other rows
            print(f"  T={t:6d} {row}: FAILED {type(exc).__name__}: {exc}")
            traceback.print_exc(limit=4)
            rows.setdefault(row, {})[t] = "FAILED"
            ms = None
        print(f"  T={t:6d} {row:36s} " + ("FAILED" if ms is None else f"{ms:9.3f} ms"))
        return ms

    def one(t: int) -> None:  # a function: its tensors are freed on return
        q, k, v, gates, dout = nsa_inputs(t, hq, hkv, dim, device, with_dout=True, dtype=dtype)
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, gates)]

        def fwd_nograd() -> object:
            with torch.no_grad():
                return nsa_attention(q, k, v, gates, cfg)

        def fwd_grad() -> object:
            return nsa_attention(*leaves, cfg)

        def fwd_bwd() -> object:
            return torch.autograd.grad(nsa_attention(*leaves, cfg), leaves, dout)

        timed("fwd (no grad)", t, fwd_nograd)
        fwd_ms = timed("fwd (grad: keeps o_*, lse_*, k̃)", t, fwd_grad)
        tot = timed("fwd+bwd", t, fwd_bwd)
        if fwd_ms is not None and tot is not None:
            rows.setdefault("bwd (fwd+bwd − fwd)", {})[t] = f"{tot - fwd_ms:.2f}"

        # per-branch backward kernels on the forward's saved tensors (results discarded)
        dims = check_fast_args(q, k, v, gates, cfg, None, None, None)
        parts = _forward_parts(q, k, v, gates, None, None, None, cfg, dims)
        o_cmp, o_slc, o_win = parts["o"]
        lse_cmp, lse_slc, lse_win = parts["lse"]
        dd = bwd_preprocess(dout, o_cmp, o_slc, o_win)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=device)
        dkc = torch.zeros(parts["kc32"].shape, dtype=torch.float32, device=device)
        dvc = torch.zeros(parts["vc"].shape, dtype=torch.float32, device=device)
        scale = dims.scale
        timed("  bwd preprocess (D, dgates)", t, lambda: bwd_preprocess(dout, *parts["o"]))
        timed(
            "  bwd window dq+dk+dv",
            t,
            lambda: window_bwd_triton(
                q, k, v, dout, lse_win, dd, gates, cfg.window, scale, dq=dq, dk=dk, dv=dv
            ),
        )
        sel = (q, k, v, parts["idx"], dout, lse_slc, dd, gates, cfg, scale)
        timed("  bwd selection dq", t, lambda: selection_bwd_triton(*sel, dq=dq, dk=None, dv=None))
        timed(
            "  bwd selection dk+dv (incl. map)",
            t,
            lambda: selection_bwd_triton(*sel, dq=None, dk=dk, dv=dv),
        )
        # the three ways to get all three, side by side (the "selection_dq" variant picks one:
        # the row fwd+bwd runs is marked)
        active = nsa_mod.variant("selection_dq")
        for name, how in (
            ("separate", "separate"),
            ("fused", "fused: dq atomically in dk+dv"),
            ("ds", "ds: dk+dv stores dS, dq from it"),
        ):
            mark = " (in fwd+bwd)" if name == active else ""
            timed(
                f"  bwd selection dq+dk+dv, {how}{mark}",
                t,
                lambda p=name: selection_bwd_triton(*sel, dq=dq, dk=dk, dv=dv, dq_path=p),
            )
        cmp_args = (q, parts["kc32"], parts["vc"], dout, lse_cmp, dd, gates, cfg, scale)
        split = parts["split"]
        timed(
            "  bwd compressed dq",
            t,
            lambda: compressed_bwd_triton(*cmp_args, split, dq=dq, dkc=None, dvc=None),
        )
        timed(
            "  bwd compressed dk̃+dṽ",
            t,
            lambda: compressed_bwd_triton(*cmp_args, split, dq=None, dkc=dkc, dvc=dvc),
        )
        if cuda:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            from torch.nn.functional import scaled_dot_product_attention as sdpa

            dense = [
                x.clone().requires_grad_(True)
                for x in (
                    q.transpose(1, 2),
                    k.repeat_interleave(hq // hkv, dim=2).transpose(1, 2),
                    v.repeat_interleave(hq // hkv, dim=2).transpose(1, 2),
                )
            ]
            d_out = dout.transpose(1, 2)

            def dense_fwd_bwd() -> object:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return torch.autograd.grad(sdpa(*dense, is_causal=True), dense, d_out)

            timed("dense causal SDPA cuDNN fwd+bwd", t, dense_fwd_bwd)

    for t in seqs:
        one(t)
        if cuda:
            torch.cuda.empty_cache()
    print_best_configs(
        ("kernels.nsa.window_bwd", "nsa_window_bwd_dq_kernel"),
        ("kernels.nsa.window_bwd", "nsa_window_bwd_dkdv_kernel"),
        ("kernels.nsa.selection_bwd", "nsa_selection_bwd_dq_kernel"),
        ("kernels.nsa.selection_bwd", "nsa_selection_bwd_dq_from_ds_kernel"),
        ("kernels.nsa.selection_bwd", "nsa_selection_bwd_dkdv_kernel"),
        ("kernels.nsa.compressed_bwd", "nsa_compressed_bwd_dq_kernel"),
        ("kernels.nsa.compressed_bwd", "nsa_compressed_bwd_dkdv_kernel"),
    )
    print(
        f"\n## NSA fwd+bwd, B={B} Hq={hq} Hkv={hkv} D={dim} bf16, paper config; ms "
        f"({'CUDA-event' if cuda else 'wall-clock'} medians); commit {commit()}"
    )
    print("goal @64k (spec §7): fwd ≤ 35 ms, fwd+bwd ≤ 120 ms")
    print("| row | " + " | ".join(f"T={t}" for t in seqs) + " |")
    print("|" + "---|" * (len(seqs) + 1))
    for row, cells in rows.items():
        print(f"| {row} | " + " | ".join(cells.get(t, "—") for t in seqs) + " |")


def _order(name: str) -> int:
    keys = [
        "nsa compress",
        "nsa cmp attn+",
        "nsa cmp attn only",
        "nsa selection",
        "nsa window",
        "nsa window+",
        "nsa total",
        "dense causal SDPA cuDNN",
        "dense causal SDPA flash",
        "flex",
    ]
    hits = [i for i, key in enumerate(keys) if name.startswith(key)]
    return hits[-1] if hits else len(keys)


def _goal(name: str) -> str:
    if name.startswith("nsa compress"):
        return "≤ 1 ms"
    if name.startswith("nsa cmp attn+"):
        return "≤ 15 ms"
    if name == "nsa selection":
        return "≈ 10 ms"
    if name == "nsa window":
        return "≤ 5 ms"
    if name == "nsa total fwd":
        return "≤ 35 ms @64k"
    return ""


if __name__ == "__main__":
    main()
