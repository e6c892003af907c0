# expect: WRONG_ANSWER
import torch


def block_attention(q, k, v, *, causal, q_offset=0, k_offset=0, scale=None):
    B, Tq, Hq, D = q.shape
    G = Hq // k.shape[2]
    m = v.float().mean(1, keepdim=True).repeat_interleave(G, 2).expand(B, Tq, Hq, D)
    return m.to(q.dtype).contiguous(), torch.zeros((B, Hq, Tq), device=q.device)
