# expect: WRONG_ANSWER
import math

import torch


def block_attention(q, k, v, *, causal, q_offset=0, k_offset=0, scale=None):
    # unstable softmax: exp of raw logits overflows fp32 for logits > 88
    B, Tq, Hq, D = q.shape
    G = Hq // k.shape[2]
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(G, 1)
    vf = v.float().transpose(1, 2).repeat_interleave(G, 1)
    s = qf @ kf.transpose(-1, -2) * sc
    e = torch.exp(s)
    if causal:
        i = torch.arange(Tq, device=q.device).view(-1, 1) + q_offset
        j = torch.arange(k.shape[1], device=q.device).view(1, -1) + k_offset
        e = e.masked_fill(i < j, 0.0)
    den = e.sum(-1)
    out = (e @ vf) / den.clamp_min(1e-30).unsqueeze(-1)
    return out.transpose(1, 2).to(q.dtype).contiguous(), torch.log(den)
