"""Pieces the NSA benchmark scripts share: the commit they ran on, the device they may run
on, their shape options, their inputs, and how far an output is from a reference."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def git(args: list[str], cwd: Path) -> str:
    """``git args`` in ``cwd``: its stdout stripped, "" when git fails or is missing."""
    try:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def commit(repo: Path = REPO) -> str:
    """Short hash of ``repo``'s HEAD (+ "-dirty" with uncommitted changes to tracked files).

    A ``git archive`` export (what runs on the GPU machine) has no .git of its own, and git
    would find a parent folder's, which may be another commit: there ``benchmarks/COMMIT``
    names the exported commit (``export-subst`` in .gitattributes fills it in; in a checkout
    it still holds the placeholder). KGRADE_COMMIT wins over both.
    """
    if os.environ.get("KGRADE_COMMIT"):
        return os.environ["KGRADE_COMMIT"]
    stamp = repo / "benchmarks" / "COMMIT"
    if stamp.is_file():
        exported = stamp.read_text().strip()
        if exported and not exported.startswith("$Format"):
            return exported
    sha = git(["rev-parse", "--short", "HEAD"], repo)
    if not sha:
        return "unknown"
    dirty = git(["status", "--porcelain", "--untracked-files=no"], repo)
    return sha + ("-dirty" if dirty else "")


def device_ready(device: str, script: str) -> bool:
    """Print why ``script`` cannot run on ``device`` and return False, or print the device,
    torch and triton and return True: CUDA, or the CPU under TRITON_INTERPRET=1."""
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print(f"{script}: needs CUDA (or --device cpu with TRITON_INTERPRET=1)")
        return False
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        print(f"{script} --device cpu: set TRITON_INTERPRET=1 (Triton kernels on CPU)")
        return False
    import triton

    name = torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)"
    print(f"device {name} torch {torch.__version__} triton {triton.__version__}")
    return True


def diff(x: torch.Tensor, ref: torch.Tensor) -> str:
    """max |x − ref| and ‖x − ref‖ / ‖ref‖ (RMS) in fp64, over the reference's finite entries
    (an lse's −inf rows); x must be non-finite exactly where the reference is."""
    x, ref = x.detach().double(), ref.detach().double()
    fin = torch.isfinite(ref)
    if not bool(torch.equal(torch.isfinite(x), fin)):
        return f"NONFINITE MISMATCH ({int((torch.isfinite(x) != fin).sum())} entries)"
    d = x[fin] - ref[fin]
    if d.numel() == 0:
        return "empty"
    rel = float(d.pow(2).mean().sqrt() / ref[fin].pow(2).mean().sqrt().clamp_min(1e-30))
    return f"max abs {float(d.abs().max()):.3e}, rel RMS {rel:.3e}"


def nsa_shape_args(ap: argparse.ArgumentParser, seqs: list[int]) -> None:
    """The NSA scripts' shape options, defaults the paper configuration's heads: --seqs (the
    lengths T), --hq, --hkv, --dim (fewer heads for a smoke test)."""
    ap.add_argument("--seqs", type=int, nargs="+", default=seqs, help="sequence lengths T")
    nsa_head_args(ap)


def nsa_head_args(ap: argparse.ArgumentParser) -> None:
    """--hq, --hkv, --dim, defaults the paper configuration's (a script of one length)."""
    ap.add_argument("--hq", type=int, default=64, help="query heads")
    ap.add_argument("--hkv", type=int, default=4, help="KV heads")
    ap.add_argument("--dim", type=int, default=128, help="head dim")


def round_robin_args(doc: str, seqs: list[int]) -> argparse.Namespace:
    """The options of a script that times modes round-robin on CUDA streams (the shape options
    and --rounds), parsed; exits with a clear message without CUDA."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    nsa_shape_args(ap, seqs)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA: streams exist only there")
    return args


def spread(xs: list[float], digits: int = 2) -> str:
    """Round-robin samples as "median (p10-p90)"."""
    s = sorted(xs)
    p10, p90 = s[len(s) // 10], s[(9 * len(s)) // 10]
    return f"{statistics.median(s):.{digits}f} ({p10:.{digits}f}-{p90:.{digits}f})"


def paired_median(xs: list[float], base: list[float]) -> float:
    """The median of round i's ratio xs[i] / base[i]: clock drift between rounds cancels."""
    return statistics.median(a / b for a, b in zip(xs, base, strict=True))


def nsa_inputs(
    t: int,
    hq: int,
    hkv: int,
    dim: int,
    device: str,
    *,
    with_dout: bool = False,
    gen: torch.Generator | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, ...]:
    """The NSA benchmarks' inputs at length t, B = 1: (q, k, v, gates[, dout]), drawn in this
    order from ``gen`` (default: a fresh generator seeded with t), so every script times the
    same tensors; a caller that draws more afterwards passes its own generator."""
    gen = gen or torch.Generator(device=device).manual_seed(t)
    q = torch.randn(1, t, hq, dim, device=device, generator=gen).to(dtype)  # [B, T, Hq, D]
    k = torch.randn(1, t, hkv, dim, device=device, generator=gen).to(dtype)  # [B, T, Hkv, D]
    v = torch.randn(1, t, hkv, dim, device=device, generator=gen).to(dtype)
    gates = torch.rand(1, t, hq, 3, device=device, generator=gen)  # [B, T, Hq, 3] fp32
    if not with_dout:
        return q, k, v, gates
    dout = torch.randn(1, t, hq, dim, device=device, generator=gen).to(dtype)
    return q, k, v, gates, dout


#: Timed calls at the least behind each GPU median (``median_ms``).
MIN_SAMPLES = 10


def median_ms(fn: Callable[[], object], cuda: bool) -> float:
    """fn's median time in ms: CUDA events after warm-up (``triton.testing.do_bench``) on the
    GPU, over at least ``MIN_SAMPLES`` timed calls; on the CPU (the interpreter's smoke runs,
    seconds a call) the middle of 3 wall-clock calls after one warm-up."""
    if cuda:
        import triton

        # do_bench times as many calls as fit in ``rep`` ms, at least one: rep=100 alone timed
        # a 120 ms fwd+bwd once and a 44 ms forward twice (every bench_nsa.py table at 64k up
        # to `de999cb`). One call first, for its length (and any compile or allocation).
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        rep = max(100.0, 1.2 * MIN_SAMPLES * start.elapsed_time(end))
        return float(triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median"))
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return sorted(times)[1]


def stored_compressed(
    k: torch.Tensor, v: torch.Tensor, cfg: object
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype]:
    """k̃ and ṽ as ``attention._forward`` stores them for a 16-bit q: k̃ in fp32 split into
    fp16 hi + lo, ṽ in fp16, and the branch outputs' dtype that goes with it: (kc_hi, kc_lo,
    vc, o_dtype). For scripts that time one branch's kernels on the forward's own inputs."""
    from kernels.nsa.attention import _split_fp16, branch_dtype
    from kernels.nsa.torch_path import compress_mean_fast

    kc_hi, kc_lo = _split_fp16(compress_mean_fast(k, cfg, torch.float32))  # type: ignore[arg-type]
    vc = compress_mean_fast(v, cfg, torch.float16)  # type: ignore[arg-type]
    return kc_hi, kc_lo, vc, branch_dtype(torch.float16)
