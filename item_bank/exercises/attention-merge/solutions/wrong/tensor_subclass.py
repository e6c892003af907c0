# expect: TYPE_VIOLATION
import torch


class Lazy(torch.Tensor):
    pass


def merge_attention(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(lse_a - safe).transpose(1, 2).unsqueeze(-1)
    wb = torch.exp(lse_b - safe).transpose(1, 2).unsqueeze(-1)
    out = (out_a.float() * wa + out_b.float() * wb).to(out_a.dtype)
    return out.as_subclass(Lazy), lse
