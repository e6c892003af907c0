"""Real Ring Attention, one process per rank (spec §3.3 ``ring_attention_local``).

Each rank keeps its queries and passes K/V around the ring by point-to-point messages only:
send the held KV block to ``rank+1``, receive the next from ``rank−1`` (P−1 transfers; no
all-gather, no broadcast). K and V travel packed in one buffer ``[2, B, T/P, Hkv, D]`` so each
step is one send and one receive. Double buffering: the transfer for step s+1 is posted with
``batch_isend_irecv`` into the spare buffer *before* step s is computed and waited on after it,
so communication hides behind compute (as zhuzilin/ring-flash-attention ``RingComm`` and
TransformerEngine's KV-P2P context parallelism do). Works with gloo (CPU) and NCCL (CUDA): with
NCCL the transfer runs on its own stream and ``wait()`` only orders the compute stream after it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .._validate import check_bool, check_bthd, check_layout, check_scale
from ..attention.backends import resolve_backend
from .schedule import RingAccumulator, accumulate_step


def _ring_peers(group: dist.ProcessGroup | None) -> tuple[int, int, int, int]:
    """(group rank, world size, global rank of the next, of the previous rank)."""
    rank = dist.get_rank(group)
    size = dist.get_world_size(group)
    g = group if group is not None else dist.group.WORLD
    # P2POp takes global ranks; map the ring neighbours from group ranks.
    nxt = dist.get_global_rank(g, (rank + 1) % size)
    prv = dist.get_global_rank(g, (rank - 1) % size)
    return rank, size, nxt, prv


def ring_attention_local(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    group: dist.ProcessGroup | None,
    layout: str = "zigzag",
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ring Attention on this rank's shards ``x[:, positions(rank)]`` (see ``kernels.ring.shard``).

    Args:
        q: ``[B, T/P, Hq, D]``; k, v: ``[B, T/P, Hkv, D]``: this rank's local shards.
        causal: causal over global positions (the layout tells which each rank holds).
        group: the process group of the ring (None: the default group); every member calls this
            with equally shaped shards.
        layout: 'contiguous', 'zigzag' or 'stripe' (how the shards were cut).
        scale: softmax scale, default 1/sqrt(D).
        backend: block kernel, as in ``ring_attention``.

    Returns:
        ``out_loc [B, T/P, Hq, D]`` (q.dtype) and ``lse_loc [B, Hq, T/P]`` fp32, local order.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "ring_attention_local needs torch.distributed initialised (init_process_group)"
        )
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise ValueError(
            f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}"
        )
    _, n, _, _, _, dk, _ = check_bthd(q, k, v, same_len=True)
    check_bool("causal", causal)
    check_layout(layout)
    scale = check_scale(scale, dk)
    if layout == "zigzag" and n % 2:
        raise ValueError(f"zigzag shards hold two equal chunks: local length must be even, got {n}")
    backend = resolve_backend(backend, q)
    rank, size, nxt, prv = _ring_peers(group)

    acc = RingAccumulator(q, v.shape[-1])
    if k.shape != v.shape:
        # Different head dims would need two messages; one packed buffer is the common case.
        kv_cur: torch.Tensor | tuple[torch.Tensor, torch.Tensor] = (k.contiguous(), v.contiguous())
    else:
        kv_cur = torch.stack([k, v])  # [2, B, T/P, Hkv, D]: one message per step
    kv_next = None
    if size > 1:
        kv_next = (
            tuple(torch.empty_like(x) for x in kv_cur)
            if isinstance(kv_cur, tuple)
            else torch.empty_like(kv_cur)
        )

    for s in range(size):
        reqs = []
        if s < size - 1:
            # Post step s+1's transfer before computing step s: it runs while we compute.
            sends = kv_cur if isinstance(kv_cur, tuple) else (kv_cur,)
            recvs = kv_next if isinstance(kv_next, tuple) else (kv_next,)
            ops = [dist.P2POp(dist.isend, t, nxt, group) for t in sends]
            ops += [dist.P2POp(dist.irecv, t, prv, group) for t in recvs]
            reqs = dist.batch_isend_irecv(ops)
        k_src, v_src = kv_cur[0], kv_cur[1]
        src = (rank - s) % size
        accumulate_step(
            acc,
            q,
            k_src,
            v_src,
            rank=rank,
            src=src,
            world_size=size,
            layout=layout,
            causal=causal,
            scale=scale,
            backend=backend,
        )
        for req in reqs:
            req.wait()
        if s < size - 1:
            # The buffer we just sent from is free again (its send completed): receive into it next.
            kv_cur, kv_next = kv_next, kv_cur
    return acc.result(q.dtype)
