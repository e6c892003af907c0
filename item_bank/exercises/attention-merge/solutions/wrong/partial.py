# expect: WRONG_ANSWER
import torch


def merge_attention(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(lse_a - safe).transpose(1, 2).unsqueeze(-1)
    wb = torch.exp(lse_b - safe).transpose(1, 2).unsqueeze(-1)
    out = torch.empty_like(out_a)
    h = out.shape[2] // 2 or 1  # only the first half of the heads is written
    out[:, :, :h] = (
        out_a[:, :, :h].float() * wa[:, :, :h] + out_b[:, :, :h].float() * wb[:, :, :h]
    ).to(out.dtype)
    return out, lse
