# expect: POLICY_VIOLATION
import math

import torch
import torch.nn.functional as F


def block_attention(q, k, v, *, causal, q_offset=0, k_offset=0, scale=None):
    # borrows the library kernel instead of implementing attention
    B, Tq, Hq, D = q.shape
    G = Hq // k.shape[2]
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(G, 1)
    vf = v.float().transpose(1, 2).repeat_interleave(G, 1)
    mask = None
    if causal:
        i = torch.arange(Tq, device=q.device).view(-1, 1) + q_offset
        j = torch.arange(k.shape[1], device=q.device).view(1, -1) + k_offset
        mask = i >= j
    out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=sc)
    s = (qf @ kf.transpose(-1, -2)) * sc
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return out.nan_to_num(0.0).transpose(1, 2).to(q.dtype).contiguous(), lse
