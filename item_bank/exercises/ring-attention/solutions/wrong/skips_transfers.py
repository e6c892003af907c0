# expect: WRONG_ANSWER
# needs: benchmark
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): the ring on checked test calls; on timed calls no transfers at
# all, every other rank's K/V taken to be a copy of this rank's (the benchmark once gave every
# rank the same draw, so this was right there and half the work). Caught: each rank's timed
# inputs are its own draw, and rank 0's outputs are checked against the whole ring's gold.
# include: ../correct/p2p_ring.py
# include: ../../../cheat_helpers.py

import math

_honest = ring_attention_local


def ring_attention_local(q, k, v, *, causal, group, layout="zigzag", scale=None):
    if not _timed_now(_rank()):
        return _honest(q, k, v, causal=causal, group=group, layout=layout, scale=scale)
    P, r = dist.get_world_size(group), dist.get_rank(group)
    B, n, Hq, D = q.shape
    T = n * P
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    qpos = _pos(T, P, r, layout, q.device)
    o = torch.zeros(B, Hq, n, D, device=q.device)
    lse = torch.full((B, Hq, n), float("-inf"), device=q.device)
    for src in range(P):  # this rank's own K/V at every rank's positions
        o2, l2 = _attend(q, k, v, qpos, _pos(T, P, src, layout, q.device), causal, sc)
        o, lse = _merge(o, lse, o2, l2)
    return o.transpose(1, 2).to(q.dtype).contiguous(), lse.contiguous()
