# expect: WRONG_ANSWER
import torch


def block_attention(q, k, v, *, causal, q_offset=0, k_offset=0, scale=None):
    B, Tq, Hq, D = q.shape
    return torch.empty_like(q), torch.empty((B, Hq, Tq), device=q.device)
