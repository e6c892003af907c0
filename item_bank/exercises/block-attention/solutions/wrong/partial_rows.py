# expect: WRONG_ANSWER
import math

import torch


def block_attention(q, k, v, *, causal, q_offset=0, k_offset=0, scale=None):
    # computes only the first half of the query rows; the rest stays unwritten
    B, Tq, Hq, D = q.shape
    G = Hq // k.shape[2]
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    half = max(1, Tq // 2)
    qf = q[:, :half].float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(G, 1)
    vf = v.float().transpose(1, 2).repeat_interleave(G, 1)
    s = qf @ kf.transpose(-1, -2) * sc
    if causal:
        i = torch.arange(half, device=q.device).view(-1, 1) + q_offset
        j = torch.arange(k.shape[1], device=q.device).view(1, -1) + k_offset
        s = s.masked_fill(i < j, float("-inf"))
    lse_h = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse_h), 0.0, lse_h).unsqueeze(-1))
    out = torch.empty_like(q)
    lse = torch.empty((B, Hq, Tq), device=q.device)
    out[:, :half] = (p @ vf).transpose(1, 2).to(q.dtype)
    lse[:, :, :half] = lse_h
    return out, lse
