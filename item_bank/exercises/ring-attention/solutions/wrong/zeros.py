# expect: WRONG_ANSWER
import torch


def ring_attention_local(q, k, v, *, causal, group, layout="zigzag", scale=None):
    B, n, Hq, D = q.shape
    return torch.zeros_like(q), torch.zeros((B, Hq, n), device=q.device)
