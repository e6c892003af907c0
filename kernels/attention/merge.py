"""Merge two attention results over disjoint key sets (spec §2), in fp32.

``lse = logaddexp(lse_a, lse_b)``; ``out = out_a·exp(lse_a − lse) + out_b·exp(lse_b − lse)``.
Where both sides saw no key, ``lse = -inf`` and we divide by ``exp(0)`` instead, so the result is
(0, -inf) and never NaN; one empty side gets weight exp(-inf) = 0 and the other weight 1.
"""

from __future__ import annotations

import torch

from .._validate import check_merge_args


def _weights(lse_a: torch.Tensor, lse_b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """fp32 [B,H,T] statistics -> (lse, w_a, w_b), the weights shaped [B,T,H,1] for out tensors."""
    lse = torch.logaddexp(lse_a, lse_b)  # [B, H, T]; -inf only where both are -inf
    safe = torch.where(lse == float("-inf"), torch.zeros_like(lse), lse)
    w_a = torch.exp(lse_a - safe).transpose(1, 2).unsqueeze(-1)  # [B, T, H, 1]
    w_b = torch.exp(lse_b - safe).transpose(1, 2).unsqueeze(-1)
    return lse, w_a, w_b


def merge_into_(
    acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
) -> None:
    """In-place merge of a block result into a running fp32 accumulator (used by the rings).

    acc_out ``[B,T,H,D]`` fp32 and acc_lse ``[B,H,T]`` fp32 may be views (a chunk of the local
    rows); out may be any float dtype (bf16 block outputs are upcast here, once).
    """
    new_lse, w_acc, w_out = _weights(acc_lse, lse.to(torch.float32))
    acc_out.mul_(w_acc).addcmul_(out, w_out)  # one pass over acc, no full-size temporary
    acc_lse.copy_(new_lse)


def merge_attention(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge (out_a, lse_a) and (out_b, lse_b), results of the same queries over disjoint keys.

    Args:
        out_a, out_b: ``[B, T, H, D]``; lse_a, lse_b: ``[B, H, T]`` float32 (natural log).

    Returns:
        ``(out [B,T,H,D] in out_a.dtype, lse [B,H,T] float32)``; computed in fp32, cast once.
    """
    check_merge_args(out_a, lse_a, out_b, lse_b)
    acc = out_a.to(torch.float32, copy=True)  # never modify the inputs
    acc_lse = lse_a.clone()
    merge_into_(acc, acc_lse, out_b, lse_b)
    return acc.to(out_a.dtype).contiguous(), acc_lse.contiguous()
