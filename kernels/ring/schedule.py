"""The per-step block plan of Ring Attention (spec §3.2), shared by the simulation and the real ring.

At step s rank r holds the KV shard of ``src = (r − s) mod P``. ``plan_step`` lists the
block-attention calls for that (r, src) pair as row ranges of the *local* q and KV shards plus the
causal offsets to use; fully masked pairs are absent (never computed, never merged).
``accumulate_step`` runs them and merges each result into fp32 accumulators.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention.backends import run_block
from ..attention.merge import merge_into_


@dataclass(frozen=True)
class Block:
    """One block_attention call: q rows [q0, q1) x KV rows [k0, k1) of the local shards."""

    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool
    q_offset: int = 0
    k_offset: int = 0


def plan_step(
    rank: int,
    src: int,
    world_size: int,
    local_len: int,
    layout: str,
    causal: bool,
    *,
    fuse: bool = True,
) -> list[Block]:
    """Blocks for rank ``rank`` attending to the KV shard of rank ``src``.

    ``fuse`` joins the zigzag diagonal step's two pairs that share the second q chunk into one
    call (keys ``[chunk src, chunk 2P−1−src]`` with a virtual shift of one chunk, which is the
    same mask); PyTorch's fused kernels only know local-causal masks, so they need ``fuse=False``.
    """
    r, p, n = rank, world_size, local_len
    if not causal:
        return [Block(0, n, 0, n, False)]
    if layout == "contiguous":
        if src > r:
            return []  # every key lies in this rank's future
        if src < r:
            return [Block(0, n, 0, n, False)]
        return [Block(0, n, 0, n, True, r * n, r * n)]
    if layout == "stripe":
        # Local index space: query i holds token i·P + r, key j token j·P + src. Visible iff
        # i >= j when src <= r, else i > j, i.e. k_offset 1.
        return [Block(0, n, 0, n, True, 0, 0 if src <= r else 1)]
    # zigzag: local rows [0, c) are chunk r, [c, 2c) chunk 2P−1−r; likewise for the KV of src.
    c = n // 2
    if src < r:
        # Both q chunks come after KV chunk src and before chunk 2P−1−src: first KV chunk only.
        return [Block(0, n, 0, c, False)]
    if src > r:
        # Only the late q chunk sees anything, and it sees both KV chunks entirely.
        return [Block(c, n, 0, n, False)]
    first, last = r * c, (2 * p - 1 - r) * c  # global starts of the two chunks
    diag_a = Block(0, c, 0, c, True, first, first)
    if fuse:
        # Late q chunk x [early KV chunk (all visible) ++ late KV chunk (diagonal)]: key j is
        # visible iff j <= i + c, the causal rule with q_offset − k_offset = c.
        return [diag_a, Block(c, n, 0, n, True, c, 0)]
    return [diag_a, Block(c, n, 0, c, False), Block(c, n, c, n, True, last, last)]


class RingAccumulator:
    """fp32 running (out, lse) for one rank's local queries, merged block by block."""

    def __init__(self, q_local: torch.Tensor, head_dim_v: int) -> None:
        b, n, hq, _ = q_local.shape
        self.out = torch.zeros((b, n, hq, head_dim_v), dtype=torch.float32, device=q_local.device)
        self.lse = torch.full((b, hq, n), float("-inf"), dtype=torch.float32, device=q_local.device)
        self._covered: list[tuple[int, int]] = []  # row ranges that already hold a result

    def add(self, q0: int, q1: int, out: torch.Tensor, lse: torch.Tensor) -> None:
        acc_out, acc_lse = self.out[:, q0:q1], self.lse[:, :, q0:q1]
        if not any(a < q1 and q0 < b for a, b in self._covered):
            # Merging into (0, -inf) is a copy; skip the arithmetic.
            acc_out.copy_(out)
            acc_lse.copy_(lse)
        else:
            merge_into_(acc_out, acc_lse, out, lse)
        self._covered.append((q0, q1))

    def result(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.out.to(dtype).contiguous(), self.lse


def accumulate_step(
    acc: RingAccumulator,
    q_local: torch.Tensor,
    k_src: torch.Tensor,
    v_src: torch.Tensor,
    *,
    rank: int,
    src: int,
    world_size: int,
    layout: str,
    causal: bool,
    scale: float,
    backend: str,
) -> None:
    """Attend the local queries to one KV shard and merge into ``acc`` (backend resolved)."""
    n = q_local.shape[1]
    for blk in plan_step(rank, src, world_size, n, layout, causal, fuse=backend == "triton"):
        out, lse = run_block(
            q_local[:, blk.q0 : blk.q1],
            k_src[:, blk.k0 : blk.k1],
            v_src[:, blk.k0 : blk.k1],
            causal=blk.causal,
            q_offset=blk.q_offset,
            k_offset=blk.k_offset,
            scale=scale,
            backend=backend,
        )
        acc.add(blk.q0, blk.q1, out, lse)
