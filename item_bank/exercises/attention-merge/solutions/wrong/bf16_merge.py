# expect: WRONG_ANSWER
import torch


def merge_attention(out_a, lse_a, out_b, lse_b):
    # lower precision: weights and accumulation in bf16
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(lse_a - safe).to(torch.bfloat16).transpose(1, 2).unsqueeze(-1)
    wb = torch.exp(lse_b - safe).to(torch.bfloat16).transpose(1, 2).unsqueeze(-1)
    out = out_a.to(torch.bfloat16) * wa + out_b.to(torch.bfloat16) * wb
    return out.to(out_a.dtype), lse.to(torch.bfloat16).float()
