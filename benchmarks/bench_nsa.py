"""NSA forward benchmark, paper configuration (spec §6/§7): B=1, Hq=64, Hkv=4, D=128, bf16.

Times our ``nsa_attention`` (three branches + gates) with a per-branch breakdown beside dense
causal SDPA (cuDNN and flash backends) and, if it compiles, FlexAttention with a 512-token
sliding window. Median CUDA-event times (triton.testing.do_bench) after warm-up; TFLOP/s use
effective FLOPs (spec §6: only visited keys). Prints a table last.

    python benchmarks/bench_nsa.py [--seqs 16384 32768 65536] [--no-flex]
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("NSA_AUTOTUNE", "1")  # before kernels are imported: tune each kernel
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402

from kernels.nsa import NSAConfig, nsa_attention  # noqa: E402
from kernels.nsa.compressed import compressed_triton  # noqa: E402
from kernels.nsa.config import num_cmp_blocks  # noqa: E402
from kernels.nsa.selection import selection_triton  # noqa: E402
from kernels.nsa.torch_path import compress_mean_fast  # noqa: E402
from kernels.nsa.window import window_triton  # noqa: E402

B, HQ, HKV, D = 1, 64, 4, 128


def bench(fn: Callable[[], object]) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


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
    gen = torch.Generator(device=dev).manual_seed(t)
    q = torch.randn(B, t, HQ, D, device=dev, generator=gen).to(torch.bfloat16)
    k = torch.randn(B, t, HKV, D, device=dev, generator=gen).to(torch.bfloat16)
    v = torch.randn(B, t, HKV, D, device=dev, generator=gen).to(torch.bfloat16)
    gates = torch.rand(B, t, HQ, 3, device=dev, generator=gen)
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

    kc = compress_mean_fast(k, cfg, torch.float16)
    vc = compress_mean_fast(v, cfg, torch.float16)
    attempt(
        "nsa compress (mean, k+v)",
        lambda: (
            compress_mean_fast(k, cfg, torch.float16),
            compress_mean_fast(v, cfg, torch.float16),
        ),
        None,
    )
    attempt(
        "nsa cmp attn+scores+top-n",
        lambda: compressed_triton(q, kc, vc, cfg, scale, True),
        fl["cmp"],
    )
    attempt("nsa cmp attn only", lambda: compressed_triton(q, kc, vc, cfg, scale, False), fl["cmp"])
    o_cmp, _, idx = compressed_triton(q, kc, vc, cfg, scale, True)
    assert idx is not None
    attempt("nsa selection", lambda: selection_triton(q, k, v, idx, cfg, scale), fl["slc"])
    o_slc, _ = selection_triton(q, k, v, idx, cfg, scale)
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
    ap.add_argument("--seqs", type=int, nargs="+", default=[16384, 32768, 65536])
    ap.add_argument("--no-flex", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_nsa: needs CUDA")
        return
    print(
        f"device {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}"
    )
    results: dict[int, dict[str, tuple[float, float | None]]] = {}
    for t in args.seqs:
        rows = run_one(t, use_flex=not args.no_flex)
        torch.cuda.empty_cache()  # run_one's tensors are gone; hand their memory back
        results[t] = {name: (ms, tf) for name, ms, tf in rows}
    for kern in (
        "nsa_compressed_fwd_kernel",
        "nsa_selection_fwd_kernel",
        "nsa_window_fwd_kernel",
    ):
        mod = {
            "nsa_compressed_fwd_kernel": "kernels.nsa.compressed",
            "nsa_selection_fwd_kernel": "kernels.nsa.selection",
            "nsa_window_fwd_kernel": "kernels.nsa.window",
        }[kern]
        fn = getattr(sys.modules[mod], kern)
        print(f"best config {kern}: {getattr(fn, 'best_config', None)}")

    print("\n## NSA fwd, B=1 Hq=64 Hkv=4 D=128 bf16, paper config; ms (effective TFLOP/s)")
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
