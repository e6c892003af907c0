# expect: WRONG_ANSWER
import math

import torch


def block_attention(q, k, v, *, causal, q_offset=0, k_offset=0, scale=None):
    # lower precision: logits and softmax in bf16
    B, Tq, Hq, D = q.shape
    G = Hq // k.shape[2]
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    qh = q.to(torch.bfloat16).transpose(1, 2)
    kh = k.to(torch.bfloat16).transpose(1, 2).repeat_interleave(G, 1)
    vh = v.to(torch.bfloat16).transpose(1, 2).repeat_interleave(G, 1)
    s = (qh @ kh.transpose(-1, -2)) * sc
    if causal:
        i = torch.arange(Tq, device=q.device).view(-1, 1) + q_offset
        j = torch.arange(k.shape[1], device=q.device).view(1, -1) + k_offset
        s = s.masked_fill(i < j, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ vh).transpose(1, 2).to(q.dtype).contiguous(), lse.float().contiguous()
