# expect: WRONG_ANSWER
import torch


def block_attention(q, k, v, *, causal, q_offset=0, k_offset=0, scale=None):
    B, Tq, Hq, D = q.shape
    return torch.zeros_like(q), torch.zeros((B, Hq, Tq), device=q.device)
