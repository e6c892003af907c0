# expect: WRONG_ANSWER
import torch

_cache = {}


def merge_attention(out_a, lse_a, out_b, lse_b):
    # caches on shape: the second call with the same shape replays a stale result
    key = tuple(out_a.shape) + (out_a.dtype,)
    if key in _cache:
        return _cache[key]
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(lse_a - safe).transpose(1, 2).unsqueeze(-1)
    wb = torch.exp(lse_b - safe).transpose(1, 2).unsqueeze(-1)
    res = ((out_a.float() * wa + out_b.float() * wb).to(out_a.dtype), lse)
    _cache[key] = (res[0].clone(), res[1].clone())
    return res
