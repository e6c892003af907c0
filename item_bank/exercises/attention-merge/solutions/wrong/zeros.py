# expect: WRONG_ANSWER
import torch


def merge_attention(out_a, lse_a, out_b, lse_b):
    return torch.zeros_like(out_a), torch.zeros_like(lse_a)
