"""Plain fp32 PyTorch references for block attention and the merge.

Written for clarity, not speed: the mask is built explicitly and the softmax is the
textbook one, so a reader can check every rule of the spec (§1, §2) line by line.
O(Tq·Tk) memory: keep it to test sizes.
"""

from __future__ import annotations

import torch


def visibility_mask(
    tq: int, tk: int, *, causal: bool, q_offset: int = 0, k_offset: int = 0, device=None
) -> torch.Tensor:
    """Bool [Tq, Tk]: True where query i may see key j (global positions for causal)."""
    if not causal:
        return torch.ones(tq, tk, dtype=torch.bool, device=device)
    qpos = q_offset + torch.arange(tq, device=device)  # [Tq]
    kpos = k_offset + torch.arange(tk, device=device)  # [Tk]
    return qpos[:, None] >= kpos[None, :]


def block_attention_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    q_offset: int = 0,
    k_offset: int = 0,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for ``block_attention``: returns (out [B,Tq,Hq,D] in q.dtype, lse [B,Hq,Tq] fp32)."""
    b, tq, hq, d = q.shape
    tk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    scale = d**-0.5 if scale is None else scale
    qf = q.float().transpose(1, 2)  # [B, Hq, Tq, D]
    # Query head h reads KV head h // G, which is what repeat_interleave produces.
    kf = k.float().transpose(1, 2).repeat_interleave(g, dim=1)  # [B, Hq, Tk, D]
    vf = v.float().transpose(1, 2).repeat_interleave(g, dim=1)  # [B, Hq, Tk, Dv]
    s = (qf @ kf.transpose(-1, -2)) * scale  # [B, Hq, Tq, Tk]
    mask = visibility_mask(
        tq, tk, causal=causal, q_offset=q_offset, k_offset=k_offset, device=q.device
    )
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [B, Hq, Tq]; -inf for rows that see no key
    # exp(s - lse) is NaN for an all -inf row (-inf - -inf): use 0 there instead.
    safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - safe_lse[..., None])  # [B, Hq, Tq, Tk]
    out = (p @ vf).transpose(1, 2)  # [B, Tq, Hq, Dv]
    return out.to(q.dtype).contiguous(), lse.contiguous()


def attention_naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Full attention over the whole sequence (causal: j <= i): the ring's ground truth."""
    return block_attention_naive(q, k, v, causal=causal, scale=scale)


def merge_attention_naive(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Textbook merge: lse = logaddexp, weights exp(lse_x - lse); (0, -inf) if both empty."""
    la = lse_a.float().transpose(1, 2)[..., None]  # [B, T, H, 1]
    lb = lse_b.float().transpose(1, 2)[..., None]
    lse = torch.logaddexp(la, lb)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    out = out_a.float() * torch.exp(la - safe) + out_b.float() * torch.exp(lb - safe)
    return out.to(out_a.dtype).contiguous(), lse[..., 0].transpose(1, 2).contiguous()
