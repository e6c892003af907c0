"""The real per-rank ring over torch.distributed: gloo on 127.0.0.1, P in {2, 4}.

One process group per world size runs every layout, causal and not, fp32 and bf16, plus a ring
over a sub-group (checks the group-rank -> global-rank mapping). Assertions run inside the
workers, started from a forkserver (tests/kernels/gloo.py), which re-raises a worker's failure
here. 8 ranks and odd sizes: test_ring_world_sizes.py.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.conftest import free_port
from tests.kernels.gloo import init_rank, launch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed"),
]


def _worker(rank: int, world_size: int, port: int) -> None:
    init_rank(rank, world_size, port)
    try:
        from kernels.attention.naive import attention_naive
        from kernels.ring import LAYOUTS, ring_attention_local, shard
        from tests.kernels.conftest import assert_attention_close

        gen = torch.Generator().manual_seed(7)  # same global tensors on every rank
        t = 384
        for dtype in (torch.float32, torch.bfloat16):
            q = torch.randn(1, t, 4, 16, generator=gen).to(dtype)
            k = torch.randn(1, t, 2, 16, generator=gen).to(dtype)
            v = torch.randn(1, t, 2, 16, generator=gen).to(dtype)
            for causal in (True, False):
                ref_out, ref_lse = attention_naive(q.float(), k.float(), v.float(), causal=causal)
                for layout in LAYOUTS:
                    q0 = shard(q, rank, world_size, layout)
                    args = [shard(x, rank, world_size, layout) for x in (q, k, v)]
                    out, lse = ring_attention_local(*args, causal=causal, group=None, layout=layout)
                    assert torch.equal(args[0], q0), "input modified"
                    assert out.dtype == dtype and out.shape == q0.shape
                    assert_attention_close(
                        out,
                        lse,
                        shard(ref_out, rank, world_size, layout),
                        shard(ref_lse, rank, world_size, layout, dim=2),
                    )
        # A ring over the odd ranks only (group ranks 0, 1 -> global 1, 3).
        if world_size == 4:
            sub = dist.new_group([1, 3])
            if rank in (1, 3):
                grank = dist.get_rank(sub)
                q = torch.randn(1, 64, 2, 16, generator=gen)
                ref = attention_naive(q, q, q, causal=True)
                qs = shard(q, grank, 2, "zigzag")
                out, lse = ring_attention_local(qs, qs, qs, causal=True, group=sub, layout="zigzag")
                assert_attention_close(
                    out,
                    lse,
                    shard(ref[0], grank, 2, "zigzag"),
                    shard(ref[1], grank, 2, "zigzag", dim=2),
                )
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [2, 4])
def test_ring_attention_local_gloo(world_size):
    launch(_worker, world_size)


def test_ring_attention_local_needs_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    from kernels.ring import ring_attention_local

    q = torch.randn(1, 8, 2, 8)
    with pytest.raises(ValueError, match="init_process_group"):
        ring_attention_local(q, q, q, causal=True, group=None)


def _nccl_worker(rank: int, world_size: int, port: int) -> None:
    """Real-size ring over NCCL, one GPU per rank; every rank checks its own shard."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # NVLink multicast stays off on shared hosts (it can take the host's GPUs down).
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    try:
        from kernels.attention.naive import attention_naive
        from kernels.ring import LAYOUTS, ring_attention_local, shard
        from tests.kernels.conftest import assert_attention_close

        dev = torch.device("cuda", rank)
        gen = torch.Generator(device=dev).manual_seed(11)  # same global tensors on every rank
        t, hq, hkv, d = 8192, 32, 8, 128  # [B, T, H, D], spec §3.4 GPU shapes (GQA 32/8)
        q = torch.randn(1, t, hq, d, generator=gen, device=dev).bfloat16()
        k = torch.randn(1, t, hkv, d, generator=gen, device=dev).bfloat16()
        v = torch.randn(1, t, hkv, d, generator=gen, device=dev).bfloat16()
        for causal in (True, False):
            ref_out, ref_lse = attention_naive(q.float(), k.float(), v.float(), causal=causal)
            for layout in LAYOUTS:
                args = [shard(x, rank, world_size, layout) for x in (q, k, v)]
                out_poison = torch.full_like(args[0], float("nan"))
                del out_poison  # the freed NaN block is what a stale output would show
                out, lse = ring_attention_local(*args, causal=causal, group=None, layout=layout)
                assert_attention_close(
                    out,
                    lse,
                    shard(ref_out, rank, world_size, layout),
                    shard(ref_lse, rank, world_size, layout, dim=2),
                )
            del ref_out, ref_lse
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
)
def test_ring_attention_local_nccl():
    world_size = min(torch.cuda.device_count(), 8)  # the 4- and 8-GPU machines use them all
    mp.spawn(_nccl_worker, args=(world_size, free_port()), nprocs=world_size, join=True)
