# expect: WRONG_ANSWER
import torch


def merge_attention(out_a, lse_a, out_b, lse_b):
    # unstable: exp(lse) overflows fp32 for lse > 88
    ea = torch.exp(lse_a).transpose(1, 2).unsqueeze(-1)
    eb = torch.exp(lse_b).transpose(1, 2).unsqueeze(-1)
    out = (out_a.float() * ea + out_b.float() * eb) / (ea + eb)
    lse = torch.log(torch.exp(lse_a) + torch.exp(lse_b))
    return out.to(out_a.dtype), lse
