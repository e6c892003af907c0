"""Sweep the launch configurations of NSA's Triton kernels on one GPU (issue 19).

    python benchmarks/sweep_nsa.py                       # the forward's compressed and selection
    python benchmarks/sweep_nsa.py --kernel slc_dq slc_kv --seqs 65536 --jobs 12   # backward

Kernels (``--kernel``): the forward's compressed branch ``cmp`` (``v2h``: attention, block
scores, top-n), selection ``slc`` (``v2``) and window + combine ``win`` (v1) and ``win2``
(v2); the backward's ``slc_dq``, ``slc_kv``,
``slc_fused`` (the dk+dv kernel adding dq too), ``slc_ds`` (the dq kernel reading the dS the
dk+dv kernel stored: its configs, timed with the dk+dv kernel), ``cmp_dq``, ``cmp_kv``,
``win_dq``, ``win_kv`` (each timed through its launch function on the forward's saved tensors,
as ``bench_nsa.py --backward`` times them). Paper configuration (Hq 64, Hkv 4, D 128, bf16,
random inputs as ``bench_nsa.py``'s). Each candidate is a kernel's own config list
(``NSA_AUTOTUNE=1``) plus the untried ones below, made the autotuner's only config in turn.
Every candidate is compiled first by ``--jobs`` processes in parallel (Triton's on-disk cache),
then timed in this process (median CUDA-event time, ``do_bench``), and its outputs checked
against the kernel's default config (its first) on the same inputs. Prints one table per kernel,
fastest first, each row's time also as a share of the default's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

os.environ["NSA_AUTOTUNE"] = "1"  # before the kernels are imported: their whole config lists
os.environ.pop("NSA_AUTOTUNE_MAX", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks._common import commit, device_ready, diff, nsa_inputs, nsa_shape_args  # noqa: E402
from kernels.nsa import NSAConfig  # noqa: E402
from kernels.nsa import compressed as cmp_mod  # noqa: E402
from kernels.nsa import compressed_bwd as cmp_bwd  # noqa: E402
from kernels.nsa import selection as slc_mod  # noqa: E402
from kernels.nsa import selection_bwd as slc_bwd  # noqa: E402
from kernels.nsa import window as win_mod  # noqa: E402
from kernels.nsa import window_bwd as win_bwd  # noqa: E402
from kernels.nsa._bwd_common import bwd_preprocess  # noqa: E402
from kernels.nsa.attention import _split_fp16, branch_dtype, check_fast_args  # noqa: E402
from kernels.nsa.backward import _forward_parts  # noqa: E402

HQ, HKV, D = 64, 4, 128
DEV = "cuda"  # --device cpu (with TRITON_INTERPRET=1, tiny shapes) smoke-tests the script

# kernel → (title, autotuner, configs to try beside its own list: (meta, warps, stages))
_CMP_EXTRA = [
    ({"BLOCK_M": bm, "BLOCK_C": bc, "P1_MULT": p1}, w, s)
    for bm, bc, p1, w, s in (
        (128, 64, 1, 8, 3),  # the default before 2026-12-02
        (128, 64, 1, 4, 2),
        (128, 64, 1, 4, 3),
        (128, 64, 1, 8, 4),
        (256, 64, 1, 8, 3),
        (128, 128, 1, 8, 2),
        (128, 128, 1, 4, 2),
        (64, 128, 1, 4, 2),
        (64, 64, 1, 4, 3),
        (128, 32, 1, 4, 3),
        (128, 32, 1, 8, 3),
        (128, 64, 2, 8, 2),
        (128, 64, 2, 4, 2),
        (128, 32, 2, 8, 3),
        (128, 128, 2, 8, 2),
        (128, 64, 4, 8, 2),
        (128, 32, 4, 8, 3),
    )
]
# NUM_STAGES is a key loop's pipeline depth, num_stages the prologue's
_SLC_EXTRA = [
    ({"NUM_STAGES": loop}, w, s)
    for loop, w, s in (
        (3, 4, 3),  # the default before 2026-12-02
        (3, 2, 3),
        (2, 4, 2),
        (2, 8, 2),
        (4, 2, 4),
        (4, 4, 4),
        (4, 1, 4),
        (3, 1, 2),
        (4, 1, 3),
        (2, 1, 1),
        (3, 1, 1),
        (1, 1, 1),
        (1, 2, 1),
        (2, 2, 1),
        (2, 4, 1),
    )
]
# Half- and quarter-block key tiles (KSPLIT 2, 4): each pipeline stage holds 2x / 4x fewer
# gathered K/V bytes in shared memory, so more programs fit on an SM at the same depth.
_KSPLIT = [
    ({"NUM_STAGES": loop, "KSPLIT": ks}, w, s)
    for ks, loop, w, s in (
        (2, 2, 1, 2),
        (2, 3, 1, 3),
        (2, 4, 1, 4),
        (2, 2, 2, 2),
        (2, 3, 2, 3),
        (2, 4, 2, 4),
        (4, 3, 1, 3),
        (4, 4, 1, 4),
        (4, 6, 1, 4),
        (4, 4, 2, 4),
        (4, 2, 1, 2),
        (2, 2, 1, 1),
        (2, 3, 1, 2),
    )
]
_SLC_EXTRA += _KSPLIT
# the backward's selection dq kernel tiles rows as the forward's does (16 rows of a GQA group)
_SLC_DQ_EXTRA = [
    ({"NUM_STAGES": loop}, w, s)
    for loop, w, s in ((2, 1, 2), (3, 1, 3), (2, 2, 2), (3, 2, 3), (2, 1, 1), (1, 1, 1))
] + _KSPLIT
_SLC_KV_EXTRA = [
    ({"BLOCK_M": bm}, w, s)
    for bm, w, s in ((32, 2, 2), (32, 4, 3), (32, 1, 2), (64, 4, 3), (16, 1, 2), (16, 2, 2))
]
# the same kernel with dq fused in: one more dot and dq's atomics per row tile, so the best
# row tile and warp count may differ from dk+dv alone
_SLC_FUSED_EXTRA = _SLC_KV_EXTRA + [
    ({"BLOCK_M": bm}, w, s) for bm, w, s in ((16, 4, 2), (32, 8, 2), (32, 2, 3), (128, 4, 2))
]
_BLOCKS = ((128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 8, 2))


def _tiles(key_tile: str) -> list[tuple[dict[str, int], int, int]]:
    """Compressed and window backward: BLOCK_M x (BLOCK_C or BLOCK_N) tiles to try."""
    return [({"BLOCK_M": m, key_tile: n}, w, s) for m, n, w, s in _BLOCKS]


KERNELS: dict[str, tuple[str, Any, list[tuple[dict[str, int], int, int]]]] = {
    "cmp": (
        "forward compressed v2h (attn + scores + top-n)",
        cmp_mod.nsa_compressed_fwd_kernel_v2,
        _CMP_EXTRA,
    ),
    "slc": ("forward selection v2", slc_mod.nsa_selection_fwd_kernel_v2, _SLC_EXTRA),
    # the window kernel's own list already spans its tiles; v1 and v2 share the kernel
    "win": ("forward window + combine v1", win_mod.nsa_window_fwd_kernel, []),
    "win2": (
        "forward window + combine v2 (mask-free interior tiles)",
        win_mod.nsa_window_fwd_kernel,
        [],
    ),
    "slc_dq": ("backward selection dq", slc_bwd.nsa_selection_bwd_dq_kernel, _SLC_DQ_EXTRA),
    "slc_kv": (
        "backward selection dk+dv (incl. the block → queries map)",
        slc_bwd.nsa_selection_bwd_dkdv_kernel,
        _SLC_KV_EXTRA,
    ),
    "slc_fused": (
        "backward selection dq+dk+dv, fused (dq added atomically by the dk+dv kernel)",
        slc_bwd.nsa_selection_bwd_dkdv_kernel,
        _SLC_FUSED_EXTRA,
    ),
    "slc_ds": (
        "backward selection dq+dk+dv, stored dS (the configs of the dq kernel reading it back)",
        slc_bwd.nsa_selection_bwd_dq_from_ds_kernel,
        _SLC_DQ_EXTRA,
    ),
    "cmp_dq": (
        "backward compressed dq",
        cmp_bwd.nsa_compressed_bwd_dq_kernel,
        _tiles("BLOCK_C"),
    ),
    "cmp_kv": (
        "backward compressed dk̃+dṽ",
        cmp_bwd.nsa_compressed_bwd_dkdv_kernel,
        _tiles("BLOCK_C"),
    ),
    "win_dq": (
        "backward window dq",
        win_bwd.nsa_window_bwd_dq_kernel,
        _tiles("BLOCK_N"),
    ),
    "win_kv": (
        "backward window dk+dv",
        win_bwd.nsa_window_bwd_dkdv_kernel,
        _tiles("BLOCK_N"),
    ),
}


class Cand(NamedTuple):
    kernel: str
    meta: tuple[tuple[str, int], ...]  # the config's constexprs, sorted
    warps: int
    stages: int

    def config(self) -> triton.Config:
        return triton.Config(dict(self.meta), num_warps=self.warps, num_stages=self.stages)

    def label(self) -> str:
        meta = " ".join(f"{k}={v}" for k, v in self.meta)
        return f"{meta} w{self.warps} s{self.stages}"


def _cand(kernel: str, meta: dict[str, int], warps: int, stages: int) -> Cand:
    return Cand(kernel, tuple(sorted(meta.items())), warps, stages)


#: each kernel's own config list at import (the first is its default, the rows' yardstick)
OWN = {
    k: [_cand(k, c.kwargs, c.num_warps, c.num_stages) for c in tuner.configs]
    for k, (_, tuner, _) in KERNELS.items()
}
DEFAULTS = {k: cands[0] for k, cands in OWN.items()}


def candidates(kernel: str) -> list[Cand]:
    """The default first, then the kernel's other configs, then the untried ones."""
    extra = [_cand(kernel, m, w, s) for m, w, s in KERNELS[kernel][2]]
    return list(dict.fromkeys(OWN[kernel] + extra))


def use(c: Cand) -> None:
    """Make ``c`` its kernel's only config (the autotuner then runs it without tuning)."""
    tuner = KERNELS[c.kernel][1]
    tuner.configs = [c.config()]
    tuner.cache.clear()


def setup(t: int) -> dict[str, Any]:
    """Inputs at length t and the forward's saved tensors, every kernel at its default."""
    for k in KERNELS:
        use(DEFAULTS[k])
    cfg = NSAConfig()
    q, k, v, gates, dout = nsa_inputs(t, HQ, HKV, D, DEV, with_dout=True)
    dims = check_fast_args(q, k, v, gates, cfg, None, None, None)
    parts = _forward_parts(q, k, v, gates, None, None, None, cfg, dims)
    # k̃ as the forward stored it: fp16 hi + lo, or in ṽ's dtype (attention._compressed_dtype)
    split = parts["split"]
    kc, kc_lo = _split_fp16(parts["kc32"]) if split else (parts["kc32"].to(parts["vc"].dtype), None)
    f32 = {"dtype": torch.float32, "device": DEV}
    return {
        "cfg": cfg,
        "scale": dims.scale,
        "q": q,
        "k": k,
        "v": v,
        "gates": gates,
        "dout": dout,
        "kc": kc,
        "kc_lo": kc_lo,
        "parts": parts,
        "dd": bwd_preprocess(dout, *parts["o"]),
        "dq": torch.zeros(q.shape, **f32),
        "dk": torch.zeros(k.shape, **f32),
        "dv": torch.zeros(v.shape, **f32),
        "dkc": torch.zeros(parts["kc32"].shape, **f32),
        "dvc": torch.zeros(parts["vc"].shape, **f32),
    }


def call(
    kernel: str, x: dict[str, Any]
) -> tuple[Callable[[], object], Callable[[], tuple], tuple[str, ...]]:
    """(the timed call, a checked call: accumulators zeroed, one run, its outputs cloned, the
    outputs' names)."""
    cfg, scale, p = x["cfg"], x["scale"], x["parts"]
    q, k, v, dout, dd, gates = x["q"], x["k"], x["v"], x["dout"], x["dd"], x["gates"]
    lse_cmp, lse_slc, lse_win = p["lse"]
    sel = (q, k, v, p["idx"], dout, lse_slc, dd, gates, cfg, scale)
    cmpb = (q, p["kc32"], p["vc"], dout, lse_cmp, dd, gates, cfg, scale, p["split"])
    win = (q, k, v, dout, lse_win, dd, gates, cfg.window, scale)
    o_dt = branch_dtype(x["kc"].dtype)  # the branch outputs as nsa_attention stores them
    fns: dict[str, tuple[Callable[[], object], tuple[str, ...]]] = {
        "cmp": (
            lambda: cmp_mod.COMPRESSED_IMPLS["v2h"](
                q, x["kc"], p["vc"], cfg, scale, True, kc_lo=x["kc_lo"], out_dtype=o_dt
            ),
            (),
        ),
        "slc": (
            lambda: slc_mod.selection_triton_v2(q, k, v, p["idx"], cfg, scale, torch.empty, o_dt),
            (),
        ),
        "win": (
            lambda: win_mod.window_triton(
                q, k, v, cfg.window, scale, combine=(p["o"][0], p["o"][1], gates)
            ),
            (),
        ),
        "win2": (
            lambda: win_mod.window_triton(
                q, k, v, cfg.window, scale, combine=(p["o"][0], p["o"][1], gates), split=True
            ),
            (),
        ),
        "slc_dq": (
            lambda: slc_bwd.selection_bwd_triton(*sel, dq=x["dq"], dk=None, dv=None, dq_acc=False),
            ("dq",),
        ),
        "slc_kv": (  # adds into dk, dv
            lambda: slc_bwd.selection_bwd_triton(*sel, dq=None, dk=x["dk"], dv=x["dv"]),
            ("dk", "dv"),
        ),
        "slc_fused": (  # adds into dq, dk, dv
            lambda: slc_bwd.selection_bwd_triton(
                *sel, dq=x["dq"], dk=x["dk"], dv=x["dv"], dq_path="fused"
            ),
            ("dq", "dk", "dv"),
        ),
        "slc_ds": (  # adds into dq, dk, dv
            lambda: slc_bwd.selection_bwd_triton(
                *sel, dq=x["dq"], dk=x["dk"], dv=x["dv"], dq_path="ds"
            ),
            ("dq", "dk", "dv"),
        ),
        "cmp_dq": (
            lambda: cmp_bwd.compressed_bwd_triton(
                *cmpb, dq=x["dq"], dkc=None, dvc=None, dq_acc=False
            ),
            ("dq",),
        ),
        "cmp_kv": (
            lambda: cmp_bwd.compressed_bwd_triton(*cmpb, dq=None, dkc=x["dkc"], dvc=x["dvc"]),
            ("dkc", "dvc"),
        ),
        "win_dq": (
            lambda: win_bwd.window_bwd_triton(*win, dq=x["dq"], dk=None, dv=None),
            ("dq",),
        ),
        "win_kv": (
            lambda: win_bwd.window_bwd_triton(*win, dq=None, dk=x["dk"], dv=x["dv"]),
            ("dk", "dv"),
        ),
    }
    fn, bufs = fns[kernel]

    def checked() -> tuple:
        if not bufs:  # the forward kernels return fresh tensors
            return tuple(fn())  # type: ignore[arg-type]
        for name in bufs:
            x[name].zero_()
        fn()
        return tuple(x[name].clone() for name in bufs)

    fwd_names = ("o", "lse", "idx") if kernel == "cmp" else ("o", "lse")
    return fn, checked, bufs or fwd_names  # the forward kernels return fresh tensors


def _compile_some(chunk: list[Cand]) -> list[tuple[Cand, str]]:
    x = setup(1024)
    failed = []
    for c in chunk:
        try:
            use(c)
            call(c.kernel, x)[0]()
            use(DEFAULTS[c.kernel])
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


def check(kernel: str, out: tuple, ref: tuple, names: tuple[str, ...]) -> str:
    if kernel == "cmp":  # (o, lse, idx)
        return (
            f"sets {same_sets(out[2], ref[2]):.5f}; o {diff(out[0], ref[0])}; "
            f"lse {diff(out[1], ref[1])}"
        )
    return "; ".join(f"{n} {diff(a, b)}" for n, a, b in zip(names, out, ref, strict=True))


def _t(t: int) -> str:
    return f"{t // 1024}k" if t % 1024 == 0 else str(t)


def sweep(kernel: str, seqs: list[int], cands: list[Cand]) -> None:
    results: dict[Cand, dict[int, str]] = {c: {} for c in cands}
    times: dict[Cand, dict[int, float]] = {c: {} for c in cands}
    for t in seqs:
        x = setup(t)
        ref = call(kernel, x)[1]()  # the default's outputs (setup left every kernel there)
        for c in cands:
            try:
                use(c)
                fn, checked, names = call(kernel, x)
                chk = check(kernel, checked(), ref, names)
                ms = bench(fn)
                times[c][t] = ms
                results[c][t] = chk
                print(f"  {kernel} T={t:6d} {c.label():34s} {ms:8.3f} ms  {chk}", flush=True)
            except Exception as exc:  # a config that fails must not hide the others
                print(f"  {kernel} T={t:6d} {c.label()}: FAILED {exc!r}"[:240], flush=True)
        use(DEFAULTS[kernel])
        del x, ref
        if DEV == "cuda":
            torch.cuda.empty_cache()
    last = seqs[-1]
    order = sorted(cands, key=lambda c: times[c].get(last, float("inf")))
    d = DEFAULTS[kernel]
    print(f"\n## {KERNELS[kernel][0]}: configs, ms (of the default's time), commit {commit()}")
    cols = " | ".join(f"T={_t(t)}" for t in seqs)
    print(f"| config | {cols} | check at T={_t(last)} vs the default |")
    print("|" + "---|" * (len(seqs) + 2))
    for c in order:
        cells = []
        for t in seqs:
            ms, base = times[c].get(t), times[d].get(t)
            share = f" ({ms / base:.3f})" if ms is not None and base else ""
            cells.append("FAILED" if ms is None else f"{ms:.2f}{share}")
        tag = " (default)" if c == d else ""
        print(f"| {c.label()}{tag} | " + " | ".join(cells) + f" | {results[c].get(last, '')} |")
    print(flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kernel", nargs="+", choices=list(KERNELS), default=["cmp", "slc"])
    ap.add_argument("--only", nargs="*", default=None, help="substrings of labels to keep")
    nsa_shape_args(ap, [16384, 65536])
    ap.add_argument("--jobs", type=int, default=8, help="parallel compile processes")
    ap.add_argument("--device", default="cuda", help="cpu: TRITON_INTERPRET=1, a smoke test")
    args = ap.parse_args()
    global DEV, HQ, HKV, D
    DEV, HQ, HKV, D = args.device, args.hq, args.hkv, args.dim
    if not device_ready(DEV, "sweep_nsa"):
        return
    print("command: python3 " + " ".join(sys.argv))
    print(f"commit {commit()}", flush=True)
    cands = [c for k in args.kernel for c in candidates(k)]
    if args.only:  # the defaults stay: every row is compared with them
        keep = set(DEFAULTS.values())
        cands = [c for c in cands if c in keep or any(o in c.label() for o in args.only)]
    if DEV == "cuda":
        chunks = [cands[i :: args.jobs] for i in range(args.jobs)]
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            for part in pool.map(_compile_some, chunks):
                for c, err in part:
                    print(f"compile {c.kernel} {c.label()}: failed {err}", flush=True)
    for kernel in args.kernel:
        sweep(kernel, args.seqs, [c for c in cands if c.kernel == kernel])


if __name__ == "__main__":
    main()
