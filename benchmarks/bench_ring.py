"""Real Ring Attention on P GPUs (NCCL, one process per GPU) against PyTorch's
``context_parallel`` around SDPA and one-GPU attention over the whole sequence, for several total
lengths in one run.

    python benchmarks/bench_ring.py                                   # P=2, T=64k (H=32, D=128, B=1)
    python benchmarks/bench_ring.py --world 4 --seq 128k,256k,512k    # the 4-GPU machine
    python benchmarks/bench_ring.py --world 8 --seq 128k,256k,512k    # the 8-GPU machine
    torchrun --nproc-per-node 8 benchmarks/bench_ring.py --seq 128k,256k,512k   # same, torchrun
    python benchmarks/bench_ring.py --dry-run --world 8 --seq 128k,256k,512k    # plan only
    python benchmarks/bench_ring.py --device cpu --world 4 --seq 64,128 --heads 2 --dim 16 \\
        --iters 2 --one-gpu-max-seq 64 --start-method forkserver     # gloo smoke test (CI)

Runs, for each total length T (causal):

* ``1 GPU cudnn`` / ``1 GPU triton``: one call over the whole sequence on one GPU (PyTorch's
  cuDNN attention; our block kernel). When T does not fit (or exceeds ``--one-gpu-max-seq``) the
  largest T/2^k that does is timed instead and scaled by the FLOPs, (T/T1)^2; the table says so.
* ``ring LAYOUT [cudnn blocks|triton blocks]``: ``kernels.ring.ring_attention_local``, zigzag and
  contiguous shards, K/V passed by P2P with the transfer behind the compute.
* ``torch context_parallel (ROTATE, cudnn)``: SDPA on cuDNN inside ``context_parallel``
  (allgather and alltoall rotation), the same inputs in ``[B, H, T, D]`` buffers.

Efficiency = t_1 / (P · t_P) with t_1 the one-GPU time of the same block kernel (cuDNN for
context_parallel). Times are medians of CUDA-event timings (wall clock on CPU), maximum over
ranks; each measurement runs ``--iters`` calls or as many as fit ``--budget-s`` (at least 3).
Correctness, per rank: its out against its shard of the one-GPU output over the whole sequence
(or, where that did not fit, against our kernel over that rank's rows and all earlier keys),
relative RMS and lse max abs against the spec §3.4 tolerances. Rank 0 prints a markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks._common import commit  # noqa: E402

# NVLink multicast stays off on these machines (shared hosts); keep it off in the children too.
for _k, _v in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
):
    os.environ.setdefault(_k, _v)

#: Spec §3.4 (tests/kernels/conftest.py): a rank passes when its out is within this relative
#: RMS of the reference and its lse within this max abs error.
OUT_REL_RMS = 5e-3
LSE_MAX_ABS = 1e-3
MIN_ITERS = 3
ONE_GPU_KERNELS = ("cudnn", "triton")
CP_ROTATIONS = ("allgather", "alltoall")
#: Imported once by the forkserver (``--start-method forkserver``) instead of by every rank.
PRELOAD = ["torch", "torch.distributed", "kernels.attention", "kernels.ring"]


@dataclass
class Row:
    """One line of the table; ``ms`` None when the run failed or was not run (``note`` says)."""

    seq: int
    run: str
    ms: float | None = None
    tflops: float | None = None  # per GPU
    eff: float | None = None
    against: str = ""  # what the efficiency is measured against
    vs_cp: float | None = None  # fastest context_parallel time / this time (> 1: faster)
    check: str = ""  # per-rank correctness
    note: str = ""
    failed: bool = False


def parse_len(text: str) -> int:
    """``131072``, ``128k`` or ``1m`` (binary multiples) as a token count."""
    s = text.strip().lower()
    mult = {"k": 1 << 10, "m": 1 << 20}.get(s[-1:], 1)
    digits = s[:-1] if mult > 1 else s
    if not digits.isdigit() or int(digits) <= 0:
        raise argparse.ArgumentTypeError(f"not a sequence length: {text!r}")
    return int(digits) * mult


def parse_lengths(text: str) -> list[int]:
    return [parse_len(p) for p in text.split(",") if p.strip()]


def fmt_len(t: int) -> str:
    if t % (1 << 20) == 0:
        return f"{t >> 20}M"
    return f"{t >> 10}k" if t % 1024 == 0 else str(t)


def causal_flops(b: int, h: int, t: int, d: int) -> float:
    """Forward FLOPs of causal attention over the whole sequence (QK^T and PV, half masked)."""
    return 4.0 * b * h * t * t * d / 2


def scaled_baseline(ms: float, t1: int, t: int) -> float:
    """One-GPU time at length t from one at t1 <= t: causal attention's work grows as T^2."""
    return ms * (t / t1) ** 2


def against(base: dict[str, tuple[float, int]], kernel: str, t: int) -> tuple[float, str]:
    """The one-GPU time at length t that a P-rank time is compared with, and how it was had:
    measured over the whole sequence, or scaled by T^2 from the largest length one GPU held."""
    if kernel not in base:
        return math.nan, f"no 1-GPU {kernel} time"
    ms1, t1 = base[kernel]
    if t1 == t:
        return ms1, f"1 GPU {kernel}, full T"
    return scaled_baseline(ms1, t1, t), f"1 GPU {kernel} at {fmt_len(t1)} x{(t / t1) ** 2:g} (T^2)"


def fmt_table(rows: Sequence[Row], title: str) -> str:
    """The markdown table rank 0 prints (and docs/perf.md keeps)."""
    out = [
        title,
        "",
        "| T | run | ms | TFLOP/s per GPU | efficiency | against | vs CP | per-rank check |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def num(x: float | None, spec: str) -> str:
        return "-" if x is None or math.isnan(x) else format(x, spec)

    for r in rows:
        ms = num(r.ms, ".2f") if not r.failed else "failed"
        eff = "-" if r.eff is None or math.isnan(r.eff) else f"{r.eff * 100:.1f} %"
        vs = "-" if r.vs_cp is None else f"{r.vs_cp:.3f}x"
        check = "; ".join(x for x in (r.check, r.note) if x) or "-"
        out.append(
            f"| {fmt_len(r.seq)} | {r.run} | {ms} | {num(r.tflops, '.0f')} | {eff} | "
            f"{r.against or '-'} | {vs} | {check} |"
        )
    return "\n".join(out)


def plan(args: argparse.Namespace) -> list[Row]:
    """The rows one run will fill, in order (``--dry-run`` prints them)."""
    rows = []
    kernels = ONE_GPU_KERNELS if args.device == "cuda" else ("triton",)
    for t in args.seq:
        rows += [Row(t, f"1 GPU {k} (full T)") for k in kernels]
        for layout in args.layouts:
            rows += [Row(t, f"ring {layout} [{b} blocks]") for b in args.backends]
        if args.device == "cuda" and not args.no_cp:
            rows += [Row(t, f"torch context_parallel ({r}, cudnn)") for r in CP_ROTATIONS]
    return rows


def check_lengths(lengths: list[int], world: int, layouts: list[str]) -> None:
    for t in lengths:
        parts = 2 * world if "zigzag" in layouts else world
        if t % parts:
            raise SystemExit(f"T={t} must be divisible by {parts} for {world} ranks ({layouts})")


# --------------------------------------------------------------------------- the ranks


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _max_over_ranks(x: float, device: torch.device) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _timeit(
    fn: Callable[[], Any],
    args: argparse.Namespace,
    device: torch.device,
    *,
    group_sync: bool = True,
) -> float:
    """Median ms per call. ``group_sync``: every rank runs the same number of calls, each after
    a barrier, so the ranks start each call together (a ring waits for its slowest member)."""
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        fn()
    _sync(device)
    per_call = (time.perf_counter() - t0) / max(1, args.warmup)
    if group_sync:
        per_call = _max_over_ranks(per_call, device)  # equal call counts, or the barriers hang
    iters = max(MIN_ITERS, min(args.iters, int(args.budget_s / max(per_call, 1e-9))))
    times = []
    for _ in range(iters):
        if group_sync:
            dist.barrier()
        if device.type == "cuda":
            _sync(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t1 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t1) * 1e3)
    return statistics.median(times)


def _oom_types() -> tuple[type[BaseException], ...]:
    return (torch.cuda.OutOfMemoryError,) if torch.cuda.is_available() else ()


def _one_gpu_fn(
    kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    from kernels.attention import block_attention
    from kernels.attention.backends import _sdpa_fused, resolve_backend

    if kernel == "triton":
        return lambda: block_attention(q, k, v, causal=True, scale=scale)
    if resolve_backend("auto", q) != "cudnn":
        raise RuntimeError("cuDNN attention not usable here")
    return lambda: _sdpa_fused(q, k, v, causal=True, scale=scale, backend="cudnn")


def _one_gpu(
    kernel: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    args: argparse.Namespace,
    device: torch.device,
) -> tuple[float, int, tuple[torch.Tensor, torch.Tensor] | None]:
    """(ms, T1, output) of ``kernel`` over the longest prefix T1 = T/2^j that fits on one GPU
    (and ``--one-gpu-max-seq``); the output only when T1 is the whole sequence."""
    t = q.shape[1]
    t1 = t
    while t1 > args.one_gpu_max_seq:
        t1 //= 2
    while True:
        # [B, T1, H, D] prefixes: the first T1 tokens, causal, are a whole sequence of their own
        fn = _one_gpu_fn(kernel, q[:, :t1], k[:, :t1], v[:, :t1], scale)
        try:
            out = fn()
            ms = _timeit(fn, args, device, group_sync=False)
            return ms, t1, (out if t1 == t else None)
        except _oom_types():
            if t1 <= 1024:
                raise
        # Out of the except block: its traceback no longer pins the failed call's tensors.
        out = fn = None
        torch.cuda.empty_cache()
        t1 //= 2


def _rank_rows_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rank: int,
    world: int,
    layout: str,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (out, lse) in local order from our block kernel, each run of consecutive
    global rows against every earlier key: O(T/P · T) work, for when one GPU cannot take T."""
    from kernels.attention import block_attention
    from kernels.ring import positions

    pos = positions(q.shape[1], rank, world, layout)
    cuts = [0, *((pos[1:] != pos[:-1] + 1).nonzero().flatten() + 1).tolist(), len(pos)]
    outs, lses = [], []
    for i, j in zip(cuts[:-1], cuts[1:], strict=True):
        a, b = int(pos[i]), int(pos[j - 1]) + 1  # global rows [a, b)
        o, lse = block_attention(
            q[:, a:b], k[:, :b], v[:, :b], causal=True, q_offset=a, k_offset=0, scale=scale
        )
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, 1), torch.cat(lses, 2)


def _errors(
    out: torch.Tensor, lse: torch.Tensor | None, ref_out: torch.Tensor, ref_lse: torch.Tensor | None
) -> tuple[float, float]:
    """(relative RMS of out, max abs error of lse; 0 without lse), NaN as inf."""
    o, r = out.float(), ref_out.float()
    rel = ((o - r).norm() / r.norm().clamp_min(1e-30)).item()
    lerr = 0.0
    if lse is not None and ref_lse is not None:
        same_inf = torch.isinf(ref_lse) & (lse == ref_lse)
        lerr = torch.where(same_inf, 0.0, (lse - ref_lse).abs()).max().item()
    return (math.inf if math.isnan(rel) else rel), (math.inf if math.isnan(lerr) else lerr)


def _per_rank_check(rel: float, lerr: float | None, device: torch.device) -> str:
    """Every rank's errors gathered (``lerr`` None: no lse to check); a summary naming the
    ranks out of tolerance and the worst rank of each error."""
    world = dist.get_world_size()
    mine = torch.tensor([rel, lerr or 0.0], dtype=torch.float64, device=device)
    allr = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(allr, mine)
    errs = [(float(x[0]), float(x[1])) for x in allr]
    bad = [r for r, (a, b) in enumerate(errs) if not (a <= OUT_REL_RMS and b <= LSE_MAX_ABS)]
    worst_o = max(range(world), key=lambda r: errs[r][0])
    detail = f"out rel {errs[worst_o][0]:.1e} (rank {worst_o})"
    if lerr is not None:
        worst_l = max(range(world), key=lambda r: errs[r][1])
        detail += f", lse {errs[worst_l][1]:.1e} (rank {worst_l})"
    if not bad:
        return f"ok {world}/{world}: {detail}"
    return f"FAIL ranks {','.join(map(str, bad))}: {detail}"


def _cp_api() -> tuple[Any, ...]:
    """PyTorch's context-parallel entry points (a private module: it moved between releases)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return init_device_mesh, context_parallel, set_rotate_method, SDPBackend, sdpa_kernel


def _cp_check(
    mesh: Any, out: torch.Tensor, ref_out: torch.Tensor, rank: int, world: int, device: torch.device
) -> str:
    """context_parallel's output ``[B, H, T/P, D]`` (its own token order) against the reference:
    all-gathered back into token order (untimed), then each rank checks its own 1/P of the
    tokens, so no rank holds fp32 copies of the whole output (24 GiB at 512k)."""
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    (full,) = context_parallel_unshard(mesh, [out], [2])  # [B, H, T, D]
    t = full.shape[2]
    sl = slice(rank * t // world, (rank + 1) * t // world)
    rel, _ = _errors(full.transpose(1, 2)[:, sl], None, ref_out[:, sl], None)
    return _per_rank_check(rel, None, device) + ", rank r: tokens [rT/P, (r+1)T/P)"


def _worker(rank: int, world: int, port: int | None, args: argparse.Namespace) -> None:
    if port is not None:  # spawned by us; torchrun sets MASTER_ADDR/PORT itself
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
    local = int(os.environ.get("LOCAL_RANK", rank))
    if args.device == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
        dtype = torch.bfloat16
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # P ranks share the host's cores
        dist.init_process_group("gloo", rank=rank, world_size=world)
        dtype = torch.float32
    title = _title(world, device, dtype, args)

    def report(rows: list[Row]) -> None:
        # After every length, not only at the end: a run cut short (a device's time limit)
        # still leaves the lengths it finished, as a table and as JSON.
        if rank == 0:
            print("\n" + fmt_table(rows, title) + "\n", flush=True)
            if args.json:
                doc = {"title": title, "argv": sys.argv, "rows": [asdict(r) for r in rows]}
                Path(args.json).write_text(json.dumps(doc, indent=1))

    try:
        _measure(rank, world, device, dtype, args, report)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _title(world: int, device: torch.device, dtype: torch.dtype, args: argparse.Namespace) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    try:
        from importlib.metadata import version

        tri = version("triton")
    except Exception:  # noqa: BLE001 - no triton on a CPU-only install
        tri = "none"
    return (
        f"Ring attention, P={world} x {name}, causal, B={args.batch}, Hq={args.heads}, "
        f"Hkv={args.kv_heads}, D={args.dim}, {str(dtype).replace('torch.', '')}; torch "
        f"{torch.__version__}, triton {tri}; commit {commit()}; {datetime.date.today().isoformat()}"
    )


def _measure(
    rank: int,
    world: int,
    device: torch.device,
    dtype: torch.dtype,
    args: argparse.Namespace,
    report: Callable[[list[Row]], None],
) -> list[Row]:
    """Every run of the plan on this rank, length by length; ``report(rows so far)`` after each
    length. Every rank makes the same collective calls in the same order."""
    from kernels.attention.backends import resolve_backend
    from kernels.ring import ring_attention_local, shard

    log = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    b, h, hkv, d = args.batch, args.heads, args.kv_heads, args.dim
    scale = d**-0.5
    rows: list[Row] = []
    mesh = None
    for t in args.seq:
        g = torch.Generator(device=device).manual_seed(t)  # the same global inputs on every rank
        q = torch.randn(b, t, h, d, device=device, generator=g, dtype=dtype)  # [B, T, Hq, D]
        k = torch.randn(b, t, hkv, d, device=device, generator=g, dtype=dtype)  # [B, T, Hkv, D]
        v = torch.randn(b, t, hkv, d, device=device, generator=g, dtype=dtype)
        fl = causal_flops(b, h, t, d)

        # One GPU over the whole sequence (each rank times its own GPU; rank 0 reports).
        base: dict[str, tuple[float, int]] = {}  # kernel -> (ms, T1)
        ref: tuple[torch.Tensor, torch.Tensor] | None = None
        ref_name = ""
        for kernel in ONE_GPU_KERNELS if device.type == "cuda" else ("triton",):
            row = Row(t, f"1 GPU {kernel} (full T)")
            try:
                ms, t1, out = _one_gpu(kernel, q, k, v, scale, args, device)
                base[kernel] = (ms, t1)
                if out is not None and ref is None:
                    ref, ref_name = out, f"1 GPU {kernel} output"
                row.ms, row.tflops = ms, causal_flops(b, h, t1, d) / ms / 1e9
                if t1 != t:
                    why = (
                        "largest that fits"
                        if t1 * 2 <= args.one_gpu_max_seq
                        else "--one-gpu-max-seq"
                    )
                    row.run = f"1 GPU {kernel} at T={fmt_len(t1)} ({why})"
                log(f"T={fmt_len(t)} {row.run}: {ms:.2f} ms")
            except Exception as exc:  # noqa: BLE001 - a row says what failed; the run goes on
                row.note, row.failed = repr(exc)[:120], True
                log(f"T={fmt_len(t)} 1 GPU {kernel} failed: {exc!r}")
            rows.append(row)
        dist.barrier()

        # Our ring: local shards, P2P K/V rotation overlapped with compute.
        ring_rows: list[Row] = []
        for layout in args.layouts:
            seen: set[str] = set()
            for backend in args.backends:
                used = resolve_backend(backend, q)
                if used in seen:  # on CPU 'auto' is ours too: one row is enough
                    continue
                seen.add(used)
                row = Row(t, f"ring {layout} [{used} blocks]")
                try:
                    qs, ks, vs = (shard(x, rank, world, layout) for x in (q, k, v))
                    fn = partial(
                        ring_attention_local,
                        qs,
                        ks,
                        vs,
                        causal=True,
                        group=None,
                        layout=layout,
                        backend=backend,
                    )
                    out, lse = fn()
                    if ref is not None:
                        r_out = shard(ref[0], rank, world, layout)
                        r_lse = shard(ref[1], rank, world, layout, dim=2)
                        what = ref_name
                    else:
                        r_out, r_lse = _rank_rows_reference(q, k, v, rank, world, layout, scale)
                        what = "our kernel over each rank's rows"
                    rel, lerr = _errors(out, lse, r_out, r_lse)
                    del out, lse, r_out, r_lse
                    row.check = f"{_per_rank_check(rel, lerr, device)} vs {what}"
                    ms = _max_over_ranks(_timeit(fn, args, device), device)
                    base_ms, row.against = against(base, used if used in base else "triton", t)
                    row.ms, row.tflops = ms, fl / world / ms / 1e9
                    row.eff = base_ms / (world * ms)
                    log(f"T={fmt_len(t)} {row.run}: {ms:.2f} ms, eff {row.eff * 100:.1f} %")
                except Exception as exc:  # noqa: BLE001
                    row.note, row.failed = repr(exc)[:120], True
                    log(f"T={fmt_len(t)} {row.run} failed: {exc!r}")
                    if rank == 0:
                        traceback.print_exc()
                rows.append(row)
                ring_rows.append(row)
                dist.barrier()

        # PyTorch context_parallel around SDPA (cuDNN), same inputs in [B, H, T, D] buffers.
        cp_ms: list[float] = []
        if device.type == "cuda" and not args.no_cp:
            for rotate in CP_ROTATIONS:
                row = Row(t, f"torch context_parallel ({rotate}, cudnn)")
                try:
                    api = _cp_api()
                    init_device_mesh, context_parallel, set_rotate_method = api[:3]
                    sdp_backend, sdpa_kernel = api[3:]
                    set_rotate_method(rotate)
                    mesh = mesh or init_device_mesh("cuda", (world,))
                    qc, kc, vc = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                    if hkv != h:
                        kc, vc = (
                            kc.repeat_interleave(h // hkv, 1),
                            vc.repeat_interleave(h // hkv, 1),
                        )
                    with (
                        sdpa_kernel(sdp_backend.CUDNN_ATTENTION),
                        context_parallel(
                            mesh,
                            buffers=[qc, kc, vc],
                            buffer_seq_dims=[2, 2, 2],
                            no_restore_buffers={qc, kc, vc},
                        ),
                    ):
                        fn = partial(F.scaled_dot_product_attention, qc, kc, vc, is_causal=True)
                        out = fn()  # [B, H, T/P, D], in context_parallel's own token order
                        ms = _max_over_ranks(_timeit(fn, args, device), device)
                    if ref is None:
                        row.check = "not checked (no whole-sequence reference)"
                    else:
                        try:
                            row.check = (
                                f"{_cp_check(mesh, out, ref[0], rank, world, device)} vs {ref_name}"
                            )
                        except Exception as exc:  # noqa: BLE001 - the timing still stands
                            row.check = f"not checked: {exc!r}"[:160]
                    del out, qc, kc, vc
                    base_ms, row.against = against(base, "cudnn", t)
                    row.ms, row.tflops = ms, fl / world / ms / 1e9
                    row.eff = base_ms / (world * ms)
                    cp_ms.append(ms)
                    log(f"T={fmt_len(t)} {row.run}: {ms:.2f} ms, eff {row.eff * 100:.1f} %")
                except Exception as exc:  # noqa: BLE001
                    row.note, row.failed = repr(exc)[:120], True
                    log(f"T={fmt_len(t)} {row.run} failed: {exc!r}")
                rows.append(row)
                dist.barrier()
        elif not args.no_cp:
            # CPU: PyTorch's context parallelism has no CPU SDPA rule; check its API is still
            # where the CUDA path looks for it, so a torch upgrade that moves it shows in CI.
            row = Row(t, "torch context_parallel")
            try:
                _cp_api()
                from torch.distributed.tensor.experimental._attention import (  # noqa: F401
                    context_parallel_unshard,
                )

                row.note = "not run: CUDA only (its imports resolve)"
            except ImportError as exc:
                row.note = f"not run: CUDA only; its imports fail: {exc}"[:160]
            rows.append(row)
        if cp_ms:
            for row in ring_rows:
                if row.ms is not None:
                    row.vs_cp = min(cp_ms) / row.ms
        del q, k, v, ref
        if device.type == "cuda":
            torch.cuda.empty_cache()
        report(rows)
    return rows


# --------------------------------------------------------------------------- launch


def _torchrun() -> tuple[int, int] | None:
    """(rank, world) when torchrun (or any launcher setting RANK/WORLD_SIZE) started us."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--seq",
        type=parse_lengths,
        default=[65536],
        help="total sequence lengths T, comma-separated (131072 or 128k); default 64k",
    )
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: --heads (MHA)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--world", type=int, default=None, help="ranks (default 2; torchrun: its)")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per run, at most")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--budget-s",
        type=float,
        default=10.0,
        help="fewer timed calls (>= 3) where --iters of them would take longer than this",
    )
    ap.add_argument("--layouts", type=lambda s: s.split(","), default=["zigzag", "contiguous"])
    ap.add_argument(
        "--backends",
        type=lambda s: s.split(","),
        default=["auto", "triton"],
        help="block kernels of our ring: auto (cuDNN where verified) and triton (ours)",
    )
    ap.add_argument(
        "--one-gpu-max-seq",
        type=parse_len,
        default=1 << 40,
        help="time the one-GPU baselines at most at this length (longer: scaled by T^2)",
    )
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--no-cp", action="store_true", help="skip torch context_parallel")
    ap.add_argument(
        "--start-method",
        choices=["spawn", "forkserver"],
        default="spawn",
        help="how the ranks start without torchrun (forkserver: torch imported once)",
    )
    ap.add_argument("--json", type=Path, help="also write the rows here (rank 0)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; start no ranks")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.kv_heads = args.kv_heads or args.heads
    launched = _torchrun()
    if launched is not None and args.world not in (None, launched[1]):
        raise SystemExit(f"--world {args.world} but torchrun started {launched[1]} ranks")
    world = launched[1] if launched is not None else (args.world or 2)
    args.world = world
    if args.heads % args.kv_heads:
        raise SystemExit(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    check_lengths(args.seq, world, args.layouts)
    if args.dry_run:
        title = f"Ring attention, P={world}, {args.device} (dry run: nothing measured)"
        print(fmt_table(plan(args), title), flush=True)
        return
    if launched is not None:
        _worker(launched[0], world, None, args)
        return
    if args.device == "cuda" and torch.cuda.device_count() < world:
        sys.exit(f"needs {world} GPUs, found {torch.cuda.device_count()}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if args.start_method == "forkserver":
        import multiprocessing

        multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    mp.start_processes(
        _worker,
        args=(world, port, args),
        nprocs=world,
        join=True,
        start_method=args.start_method,
    )


if __name__ == "__main__":
    main()
