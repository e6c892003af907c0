"""Run each Gluon kernel once, each in a process of its own with a time limit, against its
Triton counterpart: the first thing to run on a GPU after a Gluon kernel changes, before its
tests, since a barrier mistake hangs the GPU instead of failing.

    python benchmarks/gluon_smoke.py [--timeout 90] [--only NAME ...]

Prints one row per kernel: ok (with the largest differences), WRONG, ERROR or HANG (killed at
the time limit). Small odd shapes; the kernels' tests check them properly.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks._common import commit  # noqa: E402


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    fin = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(x), fin):
        return float("inf")
    return float((x[fin] - ref[fin]).norm() / ref[fin].norm().clamp_min(1e-30))


def _block_attention() -> dict[str, float]:
    from kernels.attention.block_attention import block_attention_triton
    from kernels.attention.gluon_fwd import block_attention_gluon

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 1000, 8, 128, device="cuda", generator=gen).bfloat16() for _ in "qkv")
    o, lse = block_attention_gluon(q, k, v, causal=True, block_n=128, stages=2)
    o_ref, lse_ref = block_attention_triton(q, k, v, causal=True, scale=128**-0.5)
    return {"o": _rel(o, o_ref), "lse": _rel(lse, lse_ref)}


def _compressed(name: str) -> Callable[[], dict[str, float]]:
    def run() -> dict[str, float]:
        from kernels.nsa import NSAConfig
        from kernels.nsa.compressed import COMPRESSED_IMPLS

        cfg, t, hkv, g, d = NSAConfig(), 3000, 2, 16, 128
        tc = (t - cfg.cmp_block) // cfg.cmp_stride + 1
        gen = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(1, t, hkv * g, d, device="cuda", generator=gen).bfloat16()
        kc = torch.randn(1, tc, hkv, d, device="cuda", generator=gen)
        vc = torch.randn(1, tc, hkv, d, device="cuda", generator=gen).half()
        hi = kc.half()
        lo = (kc - hi.float()).half()
        args = (q, hi, vc, cfg, d**-0.5, True)
        o, lse, idx = COMPRESSED_IMPLS[name](*args, kc_lo=lo)
        o_ref, lse_ref, idx_ref = COMPRESSED_IMPLS["v2h"](*args, kc_lo=lo)
        assert idx is not None and idx_ref is not None
        same = float((idx == idx_ref).all(-1).float().mean())
        return {"o": _rel(o, o_ref), "lse": _rel(lse, lse_ref), "idx differ": 1 - same}

    return run


def _window() -> dict[str, float]:
    from kernels.nsa.window import window_triton
    from kernels.nsa.window_gluon import window_gluon

    gen = torch.Generator(device="cuda").manual_seed(2)
    t, hq, hkv, d = 1500, 16, 2, 128
    q = torch.randn(1, t, hq, d, device="cuda", generator=gen).bfloat16()
    k, v = (torch.randn(1, t, hkv, d, device="cuda", generator=gen).bfloat16() for _ in "kv")
    gates = torch.rand(1, t, hq, 3, device="cuda", generator=gen).bfloat16()
    oc, os_ = (torch.randn(1, t, hq, d, device="cuda", generator=gen).half() for _ in "cs")
    o, lse = window_gluon(q, k, v, 512, d**-0.5, combine=(oc, os_, gates), block_n=128, stages=2)
    o_ref, lse_ref = window_triton(q, k, v, 512, d**-0.5, combine=(oc, os_, gates))
    return {"out": _rel(o, o_ref), "lse": _rel(lse, lse_ref)}


KERNELS: dict[str, tuple[Callable[[], dict[str, float]], float]] = {
    # name -> (run, the largest relative difference that still means "ok")
    "block attention (gluon_fwd)": (_block_attention, 1e-2),
    "nsa compressed g2h": (_compressed("g2h"), 1e-4),
    "nsa compressed g2p": (_compressed("g2p"), 1e-4),
    "nsa compressed g2p4": (_compressed("g2p4"), 1e-4),
    "nsa compressed g2p8": (_compressed("g2p8"), 1e-3),  # the lo product in e4m3
    "nsa compressed g3h8": (_compressed("g3h8"), 1e-3),  # three consumer warpgroups
    "nsa compressed g2p8s": (_compressed("g2p8s"), 1e-3),  # packed block-score head sums
    "nsa compressed g3h8s": (_compressed("g3h8s"), 1e-3),  # both
    "nsa compressed g3h8sq": (_compressed("g3h8sq"), 1e-3),  # + row statistics per quad lane
    "nsa window+combine g1": (_window, 1e-2),
}


def child(name: str) -> None:
    import kernels._gluon_switch as switch

    run, tol = KERNELS[name]
    errs = run()
    torch.cuda.synchronize()
    if switch.OFF:  # the variant fell back to its Triton kernel: nothing said of Gluon's
        why = "; ".join(switch.OFF.values())[:160]
        print(f"RESULT ERROR fell back to Triton: {why}", flush=True)
        return
    worst = max(errs.values())
    verdict = "ok" if worst <= tol else "WRONG"
    print(f"RESULT {verdict} " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=90.0)
    ap.add_argument("--only", nargs="+", default=None, help="kernel names (default: all)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    if not torch.cuda.is_available():
        print("gluon_smoke: needs CUDA")
        return
    print(f"commit {commit()}; {torch.cuda.get_device_name()}; torch {torch.__version__}")
    rows = []
    for name in args.only or list(KERNELS):
        t0 = time.perf_counter()
        try:
            p = subprocess.run(
                [sys.executable, __file__, "--child", name],
                capture_output=True,
                text=True,
                timeout=args.timeout,
            )
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            if p.returncode == 0 and lines:
                result = lines[-1].removeprefix("RESULT ")
            else:
                tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
                result = f"ERROR (exit {p.returncode}): {tail[:160]}"
        except subprocess.TimeoutExpired:
            result = f"HANG (killed after {args.timeout:.0f} s)"
        rows.append((name, result, time.perf_counter() - t0))
        print(f"  {name}: {result}", flush=True)
    print("\n| kernel | result | s (compile included) |\n|---|---|---|")
    for name, result, sec in rows:
        print(f"| {name} | {result} | {sec:.0f} |")


if __name__ == "__main__":
    main()
