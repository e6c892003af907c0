# expect: WRONG_ANSWER
from types import SimpleNamespace

import torch


def nsa_attention(q, k, v, gates, config, *, block_indices=None, return_aux=False):
    B, T, Hq, D = q.shape
    out = torch.zeros_like(q)
    if not return_aux:
        return out
    bi = torch.full((B, T, k.shape[2], config.sel_count), -1, dtype=torch.int32, device=q.device)
    z = torch.zeros(B, T, Hq, device=q.device)
    return out, SimpleNamespace(block_indices=bi, lse_cmp=z, lse_slc=z.clone(), lse_win=z.clone())
