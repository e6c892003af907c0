"""Single-process Ring Attention (spec §3.3 ``ring_attention``): all P ranks simulated in turn.

Shards the global q/k/v with the layout, runs the P×P schedule with ``block_attention`` calls and
fp32 merges, and unshards. It never makes one full-attention call, so it checks the schedule and
the merge; on one GPU the total time is layout-independent, hence ``rank_forward`` for timing
each rank alone (the benchmarks report the maximum over ranks).
"""

from __future__ import annotations

import torch

from .._validate import (
    check_bool,
    check_bthd,
    check_int,
    check_layout,
    check_ring_length,
    check_scale,
)
from ..attention.backends import resolve_backend
from .layouts import shard, unshard
from .schedule import RingAccumulator, accumulate_step


def rank_forward(
    q_local: torch.Tensor,
    k_shards: list[torch.Tensor],
    v_shards: list[torch.Tensor],
    *,
    rank: int,
    causal: bool,
    layout: str,
    scale: float,
    backend: str = "triton",
) -> tuple[torch.Tensor, torch.Tensor]:
    """What rank ``rank`` computes over its P steps, given every rank's KV shard (no checks)."""
    p = len(k_shards)
    acc = RingAccumulator(q_local, v_shards[0].shape[-1])
    for s in range(p):
        src = (rank - s) % p
        accumulate_step(
            acc,
            q_local,
            k_shards[src],
            v_shards[src],
            rank=rank,
            src=src,
            world_size=p,
            layout=layout,
            causal=causal,
            scale=scale,
            backend=backend,
        )
    return acc.result(q_local.dtype)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    world_size: int,
    layout: str = "zigzag",
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Simulated Ring Attention over ``world_size`` ranks on global tensors.

    Args:
        q: ``[B, T, Hq, D]``; k, v: ``[B, T, Hkv, D]`` (Hq % Hkv == 0); T divisible by P
            (contiguous, stripe) or 2P (zigzag).
        causal: key j visible to query i iff j <= i (global positions).
        world_size: number of simulated ranks P >= 1.
        layout: 'contiguous', 'zigzag' or 'stripe'.
        scale: softmax scale, default 1/sqrt(D).
        backend: block kernel: 'auto' (CUDA: verified cuDNN, else flash, else ours), 'triton'
            (ours: Triton on CUDA, the PyTorch fallback on CPU), 'cudnn', 'flash'.

    Returns:
        ``out [B, T, Hq, D]`` in q.dtype and ``lse [B, Hq, T]`` fp32, in original token order.
    """
    _, t, _, _, _, dk, _ = check_bthd(q, k, v, same_len=True)
    check_bool("causal", causal)
    check_int("world_size", world_size, minimum=1)
    check_layout(layout)
    check_ring_length("q", t, world_size, layout)
    scale = check_scale(scale, dk)
    backend = resolve_backend(backend, q)
    p = world_size
    q_sh = [shard(q, r, p, layout) for r in range(p)]
    k_sh = [shard(k, r, p, layout) for r in range(p)]
    v_sh = [shard(v, r, p, layout) for r in range(p)]
    outs, lses = [], []
    for r in range(p):
        out, lse = rank_forward(
            q_sh[r], k_sh, v_sh, rank=r, causal=causal, layout=layout, scale=scale, backend=backend
        )
        outs.append(out)
        lses.append(lse)
    return unshard(outs, p, layout, dim=1), unshard(lses, p, layout, dim=2)
