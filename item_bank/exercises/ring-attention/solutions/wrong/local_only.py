# expect: WRONG_ANSWER
import math

import torch
import torch.distributed as dist


def ring_attention_local(q, k, v, *, causal, group, layout="zigzag", scale=None):
    # attends only to the local chunk (no communication at all)
    B, n, Hq, D = q.shape
    G = Hq // k.shape[2]
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(G, 1)
    vf = v.float().transpose(1, 2).repeat_interleave(G, 1)
    s = qf @ kf.transpose(-1, -2) * sc
    if causal:
        s = s.masked_fill(
            torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf")
        )
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1))
    return (p @ vf).transpose(1, 2).to(q.dtype).contiguous(), lse.contiguous()
