# expect: WRONG_ANSWER
import torch


def merge_attention(out_a, lse_a, out_b, lse_b):
    # never writes the outputs: whatever the allocator hands back (NaN-poisoned by the harness)
    return torch.empty_like(out_a), torch.logaddexp(lse_a, lse_b)
