"""Real Ring Attention on 2 GPUs (NCCL, one process per GPU, no torchrun) vs PyTorch's
``context_parallel`` around SDPA timed in the same run, plus the one-GPU baselines.

    python benchmarks/bench_ring_2gpu.py                       # T=64k total, H=32, D=128, B=1
    python benchmarks/bench_ring_2gpu.py --seq 131072
    python benchmarks/bench_ring_2gpu.py --device cpu --seq 4096 --heads 4 --iters 3   # smoke test (gloo)

Per-GPU efficiency = t_1 / (P · t_P), t_1 = one call of the same block kernel over the full
sequence on one GPU (spec §7). Times are medians of CUDA-event timings, maximum over ranks.
Prints a table last (rank 0).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
import traceback
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# NVLink multicast stays off on these machines (shared hosts); keep it off in the children too.
for _k, _v in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
):
    os.environ.setdefault(_k, _v)


def _timeit(fn, iters: int, warmup: int, device: torch.device, group_sync: bool = True) -> float:
    """Median ms over iters; with a barrier before each so every rank starts together."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if group_sync and dist.is_initialized():
            dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _max_over_ranks(x: float, device: torch.device) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
        dtype = torch.bfloat16
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        dtype = torch.float32
    from kernels.attention import block_attention
    from kernels.attention.backends import _sdpa_fused, resolve_backend
    from kernels.ring import ring_attention_local, shard

    rows: list[tuple[str, float, str]] = []
    log = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    b, t, h, hkv, d = 1, args.seq, args.heads, args.kv_heads, args.dim
    g = torch.Generator(device=device).manual_seed(0)  # same global inputs on every rank
    q = torch.randn(b, t, h, d, device=device, generator=g).to(dtype)
    k = torch.randn(b, t, hkv, d, device=device, generator=g).to(dtype)
    v = torch.randn(b, t, hkv, d, device=device, generator=g).to(dtype)
    fl = 4.0 * b * h * t * t * d / 2  # causal
    scale = d**-0.5

    # One-GPU baselines over the full sequence (each rank measures its own GPU; rank 0 reports).
    ref_out = ref_lse = None
    t1: dict[str, float] = {}
    for kernel in ("cudnn", "triton"):
        if device.type != "cuda" and kernel != "triton":
            continue
        try:
            if kernel == "triton":
                fn = lambda: block_attention(q, k, v, causal=True, scale=scale)
            else:
                if resolve_backend("auto", q) != "cudnn":
                    raise RuntimeError("cuDNN attention not usable here")
                fn = lambda: _sdpa_fused(q, k, v, causal=True, scale=scale, backend="cudnn")
            out, lse = fn()
            if ref_out is None:
                ref_out, ref_lse = out, lse
            t1[kernel] = _timeit(fn, args.iters, 2, device, group_sync=False)
            rows.append(
                (f"1 GPU {kernel} (full T)", t1[kernel], f"{fl / t1[kernel] / 1e9:.0f} TFLOP/s")
            )
            log(f"1 GPU {kernel}: {t1[kernel]:.2f} ms")
        except Exception as exc:
            log(f"1 GPU {kernel} failed: {exc!r}")
    dist.barrier()

    # Our ring: local shards, P2P K/V rotation overlapped with compute.
    for layout in args.layouts.split(","):
        for backend in args.backends.split(","):
            name = f"ring {layout} [{backend}]"
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
                err = (
                    (out.float() - shard(ref_out, rank, world, layout).float()).norm()
                    / shard(ref_out, rank, world, layout).float().norm()
                ).item()
                lerr = (lse - shard(ref_lse, rank, world, layout, dim=2)).abs().max().item()
                ms = _max_over_ranks(_timeit(fn, args.iters, 3, device), device)
                err = _max_over_ranks(err, device)
                used = resolve_backend(backend, q)
                base = t1.get(used if used in t1 else "triton", float("nan"))
                eff = base / (world * ms)
                rows.append(
                    (
                        name + f" ({used} blocks)",
                        ms,
                        f"eff {eff * 100:.1f}% vs 1-GPU {used}; rel err {err:.1e}, lse {lerr:.1e}",
                    )
                )
                log(f"{name}: {ms:.2f} ms, efficiency {eff * 100:.1f} %, rel err {err:.2e}")
            except Exception as exc:
                log(f"{name} failed: {exc!r}")
                if rank == 0:
                    traceback.print_exc()
            dist.barrier()

    # PyTorch context_parallel around SDPA (cuDNN blocks), same inputs, [B, H, T, D] buffers.
    if device.type == "cuda" and not args.no_cp:
        for rotate in ("allgather", "alltoall"):
            name = f"torch context_parallel ({rotate}, cudnn)"
            try:
                from torch.distributed.device_mesh import init_device_mesh
                from torch.distributed.tensor.experimental import context_parallel
                from torch.distributed.tensor.experimental._attention import set_rotate_method
                from torch.nn.attention import SDPBackend, sdpa_kernel

                set_rotate_method(rotate)
                mesh = init_device_mesh("cuda", (world,))
                qc, kc, vc = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # [B, H, T, D]
                if hkv != h:
                    kc, vc = kc.repeat_interleave(h // hkv, 1), vc.repeat_interleave(h // hkv, 1)
                with (
                    sdpa_kernel(SDPBackend.CUDNN_ATTENTION),
                    context_parallel(
                        mesh,
                        buffers=[qc, kc, vc],
                        buffer_seq_dims=[2, 2, 2],
                        no_restore_buffers={qc, kc, vc},
                    ),
                ):
                    fn = partial(F.scaled_dot_product_attention, qc, kc, vc, is_causal=True)
                    ms = _max_over_ranks(_timeit(fn, args.iters, 3, device), device)
                eff = t1.get("cudnn", float("nan")) / (world * ms)
                rows.append((name, ms, f"eff {eff * 100:.1f}% vs 1-GPU cudnn"))
                log(f"{name}: {ms:.2f} ms, efficiency {eff * 100:.1f} %")
            except Exception as exc:
                log(f"{name} failed: {exc!r}")
            dist.barrier()

    if rank == 0:
        print(
            f"\nRing attention, {world} x {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
            f"causal, B={b}, T={t} total, Hq={h}, Hkv={hkv}, D={d}, {dtype}"
        )
        print("| run | ms | notes |\n|---|---|---|")
        for name, ms, note in rows:
            print(f"| {name} | {ms:.2f} | {note} |")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seq", type=int, default=65536, help="total sequence length T")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: --heads (MHA)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--layouts", default="zigzag,contiguous")
    ap.add_argument("--backends", default="auto,triton", help="block kernels for our ring")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--no-cp", action="store_true", help="skip torch context_parallel")
    args = ap.parse_args()
    args.kv_heads = args.kv_heads or args.heads
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        sys.exit(f"needs {args.world} GPUs, found {torch.cuda.device_count()}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(args.world, port, args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
