"""Sweep the launch configurations of NSA's two largest forward kernels on one GPU (issue 19).

    python benchmarks/sweep_nsa.py                       # compressed v2h and selection v2
    python benchmarks/sweep_nsa.py --kernel cmp --seqs 65536 --jobs 12

The compressed branch (``v2h``: attention, block scores, top-n) and the selection branch
(``v2``) are timed with each candidate config in turn, paper configuration (Hq 64, Hkv 4,
D 128, bf16, random inputs as ``bench_nsa.py``'s), the autotuner's config list replaced by
the one candidate. Every candidate is compiled first by ``--jobs`` processes in parallel
(Triton's on-disk cache), then timed in this process (median CUDA-event time,
``triton.testing.do_bench``). Each candidate's outputs are checked against the default
config's on the same inputs: the compressed branch's top-n sets (share of rows equal) and
outputs, the selection branch's outputs. Prints one table per kernel, fastest first.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks._common import commit, device_ready  # noqa: E402
from kernels.nsa import NSAConfig  # noqa: E402
from kernels.nsa.attention import _split_fp16  # noqa: E402
from kernels.nsa.compressed import COMPRESSED_IMPLS, nsa_compressed_fwd_kernel_v2  # noqa: E402
from kernels.nsa.selection import nsa_selection_fwd_kernel_v2, selection_triton_v2  # noqa: E402
from kernels.nsa.torch_path import compress_mean_fast  # noqa: E402

HQ, HKV, D = 64, 4, 128
DEV = "cuda"  # --device cpu (with TRITON_INTERPRET=1, tiny --seqs) smoke-tests the script


class Cand(NamedTuple):
    kernel: str  # "cmp" | "slc"
    meta: tuple[tuple[str, int], ...]  # the config's constexprs
    warps: int
    stages: int

    def config(self) -> triton.Config:
        return triton.Config(dict(self.meta), num_warps=self.warps, num_stages=self.stages)

    def label(self) -> str:
        meta = " ".join(f"{k}={v}" for k, v in self.meta)
        return f"{meta} w{self.warps} s{self.stages}"


_KERNELS = {"cmp": nsa_compressed_fwd_kernel_v2, "slc": nsa_selection_fwd_kernel_v2}


def _from_config(kernel: str, c: triton.Config) -> Cand:
    return Cand(kernel, tuple(sorted(c.kwargs.items())), c.num_warps, c.num_stages)


#: each kernel's default (its autotuner's first config at import), the rows' yardstick
DEFAULTS = {k: _from_config(k, kern.configs[0]) for k, kern in _KERNELS.items()}


def candidates(kernel: str) -> list[Cand]:
    """The current defaults first, then every other config measured so far."""
    out: list[Cand] = []
    if kernel in ("cmp", "both"):
        out.append(DEFAULTS["cmp"])
        # pass 1 (the row's lse: one QK̃ dot, no p·ṽ) on key tiles P1_MULT times as wide
        for bm, bc, p1, w, s in (
            (128, 64, 1, 8, 3),  # the default before 2026-12-02
            (128, 64, 1, 4, 2),
            (128, 64, 1, 4, 3),
            (256, 64, 1, 8, 2),
            (128, 64, 1, 8, 4),
            (256, 64, 1, 8, 3),
            (128, 128, 1, 8, 2),
            (128, 128, 1, 4, 2),
            (64, 128, 1, 4, 2),
            (64, 64, 1, 4, 3),
            (128, 32, 1, 4, 3),
            (128, 32, 1, 8, 3),
            (128, 64, 2, 8, 3),
            (128, 64, 2, 8, 2),
            (128, 64, 2, 4, 2),
            (128, 32, 2, 8, 3),
            (128, 128, 2, 8, 2),
            (128, 64, 4, 8, 3),
            (128, 64, 4, 8, 2),
            (128, 32, 4, 8, 3),
        ):
            meta = {"BLOCK_M": bm, "BLOCK_C": bc, "P1_MULT": p1}
            out.append(Cand("cmp", tuple(sorted(meta.items())), w, s))
    if kernel in ("slc", "both"):
        out.append(DEFAULTS["slc"])
        # NUM_STAGES is the key loop's pipeline depth, num_stages the prologue's
        for loop, w, s in (
            (3, 4, 3),  # the default before 2026-12-02
            (3, 2, 3),
            (2, 4, 2),
            (2, 8, 2),
            (2, 2, 2),
            (4, 2, 4),
            (4, 4, 4),
            (3, 1, 3),
            (4, 1, 4),
            (2, 1, 2),
            (3, 1, 2),
            (4, 1, 3),
            (2, 1, 1),
            (3, 1, 1),
            (1, 1, 1),
            (1, 2, 1),
            (2, 2, 1),
            (1, 4, 1),
            (2, 4, 1),
        ):
            out.append(Cand("slc", (("NUM_STAGES", loop),), w, s))
    return list(dict.fromkeys(out))  # the default once, first


def use(c: Cand) -> None:
    """Make ``c`` the kernel's only config (the autotuner then runs it without tuning)."""
    kern = _KERNELS[c.kernel]
    kern.configs = [c.config()]
    kern.cache.clear()


def inputs(t: int) -> dict[str, torch.Tensor]:
    cfg = NSAConfig()
    gen = torch.Generator(device=DEV).manual_seed(t)
    q = torch.randn(1, t, HQ, D, device=DEV, generator=gen).to(torch.bfloat16)
    k = torch.randn(1, t, HKV, D, device=DEV, generator=gen).to(torch.bfloat16)
    v = torch.randn(1, t, HKV, D, device=DEV, generator=gen).to(torch.bfloat16)
    # as nsa_attention does for bf16 inputs: k̃ in fp32 split into fp16 hi + lo, ṽ in fp16
    kc, kc_lo = _split_fp16(compress_mean_fast(k, cfg, torch.float32))
    vc = compress_mean_fast(v, cfg, torch.float16)
    return {"q": q, "k": k, "v": v, "kc": kc, "kc_lo": kc_lo, "vc": vc}


def call(c: Cand, x: dict[str, torch.Tensor], idx: torch.Tensor | None) -> Callable[[], tuple]:
    cfg, scale = NSAConfig(), D**-0.5
    if c.kernel == "cmp":
        fn = COMPRESSED_IMPLS["v2h"]
        return lambda: fn(x["q"], x["kc"], x["vc"], cfg, scale, True, kc_lo=x["kc_lo"])
    assert idx is not None
    return lambda: selection_triton_v2(x["q"], x["k"], x["v"], idx, cfg, scale)


def _compile_some(chunk: list[Cand]) -> list[tuple[Cand, str]]:
    x = inputs(1024)
    idx = None
    failed = []
    for c in chunk:
        try:
            if c.kernel == "slc" and idx is None:
                use(DEFAULTS["cmp"])
                idx = call(DEFAULTS["cmp"], x, None)()[2]
            use(c)
            call(c, x, idx)()
        except Exception as exc:  # reported again by the timing pass
            failed.append((c, repr(exc)[:160]))
    return failed


def bench(fn: Callable[[], object]) -> float:
    if DEV == "cpu":  # the interpreter: one wall-clock call, enough for a smoke test
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def same_sets(a: torch.Tensor, b: torch.Tensor) -> float:
    """Share of (t, KV head) rows whose selected block sets are equal."""
    sa, sb = a.sort(dim=-1).values, b.sort(dim=-1).values
    return float((sa == sb).all(dim=-1).float().mean())


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    ok = torch.isfinite(b)
    return float((a[ok] - b[ok]).norm() / b[ok].norm().clamp_min(1e-30))


def _t(t: int) -> str:
    return f"{t // 1024}k" if t % 1024 == 0 else str(t)


def sweep(kernel: str, seqs: list[int], cands: list[Cand]) -> None:
    results: dict[Cand, dict[int, str]] = {c: {} for c in cands}
    times: dict[Cand, dict[int, float]] = {c: {} for c in cands}
    for t in seqs:
        x = inputs(t)
        base = DEFAULTS["cmp"]
        use(base)
        o_ref, lse_ref, idx = call(base, x, None)()
        if kernel == "slc":
            use(DEFAULTS["slc"])
            o_ref, lse_ref = call(DEFAULTS["slc"], x, idx)()
        for c in cands:
            try:
                use(c)
                fn = call(c, x, idx)
                out = fn()
                chk = f"o {rel(out[0], o_ref):.1e}, lse {rel(out[1], lse_ref):.1e}"
                if kernel == "cmp":
                    chk = f"sets {same_sets(out[2], idx):.5f}, " + chk
                del out
                ms = bench(fn)
                times[c][t] = ms
                results[c][t] = chk
                print(f"  {kernel} T={t:6d} {c.label():34s} {ms:8.3f} ms  {chk}", flush=True)
            except Exception as exc:  # a config that fails must not hide the others
                print(f"  {kernel} T={t:6d} {c.label()}: FAILED {exc!r}"[:240], flush=True)
        del x, o_ref, lse_ref, idx
        torch.cuda.empty_cache()
    last = seqs[-1]
    order = sorted(cands, key=lambda c: times[c].get(last, float("inf")))
    d = DEFAULTS[kernel]
    name = "compressed v2h (attn + scores + top-n)" if kernel == "cmp" else "selection v2"
    print(f"\n## {name}: configs, ms (of the default's time), commit {commit()}")
    cols = " | ".join(f"T={_t(t)}" for t in seqs)
    print(f"| config | {cols} | check at T={_t(last)} vs the default |")
    print("|" + "---|" * (len(seqs) + 2))
    for c in order:
        cells = []
        for t in seqs:
            ms = times[c].get(t)
            ref = times[d].get(t)
            cells.append(
                "FAILED" if ms is None else f"{ms:.2f}" + (f" ({ms / ref:.3f})" if ref else "")
            )
        tag = " (default)" if c == d else ""
        print(f"| {c.label()}{tag} | " + " | ".join(cells) + f" | {results[c].get(last, '')} |")
    print(flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kernel", choices=["cmp", "slc", "both"], default="both")
    ap.add_argument("--only", nargs="*", default=None, help="substrings of labels to keep")
    ap.add_argument("--seqs", type=int, nargs="+", default=[16384, 65536])
    ap.add_argument("--jobs", type=int, default=8, help="parallel compile processes")
    ap.add_argument("--device", default="cuda", help="cpu: TRITON_INTERPRET=1, a smoke test")
    ap.add_argument("--hq", type=int, default=64, help="query heads (fewer for a smoke test)")
    ap.add_argument("--hkv", type=int, default=4, help="KV heads")
    ap.add_argument("--dim", type=int, default=128, help="head dim")
    args = ap.parse_args()
    global DEV, HQ, HKV, D
    DEV, HQ, HKV, D = args.device, args.hq, args.hkv, args.dim
    if not device_ready(DEV, "sweep_nsa"):
        return
    print("command: python3 " + " ".join(sys.argv))
    print(f"commit {commit()}", flush=True)
    cands = candidates(args.kernel)
    if args.only:  # the defaults stay: every row is compared with them
        keep = set(DEFAULTS.values())
        cands = [c for c in cands if c in keep or any(o in c.label() for o in args.only)]
    chunks = [cands[i :: args.jobs] for i in range(args.jobs)]
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        for part in pool.map(_compile_some, chunks if DEV == "cuda" else []):
            for c, err in part:
                print(f"compile {c.label()}: failed {err}", flush=True)
    for kernel in ("cmp", "slc"):
        mine = [c for c in cands if c.kernel == kernel]
        if mine:
            sweep(kernel, args.seqs, mine)


if __name__ == "__main__":
    main()
