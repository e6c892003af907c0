"""Chunked PyTorch NSA forward for plain CPU tensors (and any device as a fallback).

Same math as the naive reference, but every branch walks query chunks so memory stays
O(chunk · keys) instead of O(T²). All arithmetic is fp32.
"""

from __future__ import annotations

import torch

from kernels.nsa.config import NSAConfig, num_cmp_blocks, omega_matrix
from kernels.nsa.naive import select_blocks

# Rough cap on the fp32 elements of one chunk's largest intermediate (≈ 256 MB).
_CHUNK_ELEMS = 1 << 26


def _chunk_len(per_row: int, t: int) -> int:
    return max(1, min(t, _CHUNK_ELEMS // max(per_row, 1)))


def compress_mean_fast(x: torch.Tensor, cfg: NSAConfig, out_dtype: torch.dtype) -> torch.Tensor:
    """Mean pooling without an unfold copy: sum stride-sized chunks, then add l/d of them.

    x [B, T, H, D] → [B, Tc, H, D] in out_dtype (sums in fp32).
    """
    b, t, h, dd = x.shape
    tc = num_cmp_blocks(t, cfg)
    d, ratio = cfg.cmp_stride, cfg.cmp_block // cfg.cmp_stride
    if tc == 0:
        return x.new_zeros((b, 0, h, dd), dtype=out_dtype)
    nchunk = tc + ratio - 1  # chunks of d tokens that the Tc blocks cover
    c = x[:, : nchunk * d].reshape(b, nchunk, d, h, dd).sum(dim=2, dtype=torch.float32)
    acc = c[:, 0:tc].clone()
    for r in range(1, ratio):
        acc += c[:, r : r + tc]
    return (acc / cfg.cmp_block).to(out_dtype)


def _masked_softmax_parts(
    logits: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = logits.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(logits - safe.unsqueeze(-1)) * mask, lse


def compressed_torch(
    q: torch.Tensor,
    kc: torch.Tensor,
    vc: torch.Tensor,
    cfg: NSAConfig,
    scale: float,
    want_indices: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Compressed branch (+ scores and top-n when want_indices).

    q [B,T,Hq,Dk], kc [B,Tc,Hkv,Dk], vc [B,Tc,Hkv,Dv] → o [B,T,Hq,Dv] fp32, lse [B,T,Hq] fp32,
    indices [B,T,Hkv,n] int32 or None.
    """
    b, t, hq, _ = q.shape
    tc, hkv, dv = kc.shape[1], kc.shape[2], vc.shape[3]
    g = hq // hkv
    ts = -(-t // cfg.sel_block)
    dev = q.device
    o = torch.empty((b, t, hq, dv), dtype=torch.float32, device=dev)
    lse = torch.empty((b, t, hq), dtype=torch.float32, device=dev)
    idx = (
        torch.empty((b, t, hkv, cfg.sel_count), dtype=torch.int32, device=dev)
        if want_indices
        else None
    )
    kcf = kc.float().permute(0, 2, 1, 3)  # [B, Hkv, Tc, Dk]
    vcf = vc.float().permute(0, 2, 1, 3)  # [B, Hkv, Tc, Dv]
    omega = omega_matrix(tc, ts, cfg).to(dev) if want_indices else None  # [Tc, Ts]
    ci = torch.arange(tc, device=dev)
    step = _chunk_len(b * hq * max(tc, ts), t)
    for t0 in range(0, t, step):
        t1 = min(t, t0 + step)
        pos = torch.arange(t0, t1, device=dev)
        qc = q[:, t0:t1].float().reshape(b, t1 - t0, hkv, g, -1).permute(0, 2, 3, 1, 4)
        # qc [B, Hkv, G, C, Dk]; logits [B, Hkv, G, C, Tc]
        logits = scale * qc @ kcf.unsqueeze(2).transpose(-1, -2)
        mask = (ci[None, :] * cfg.cmp_stride + cfg.cmp_block - 1) <= pos[:, None]  # [C, Tc]
        p, lse_c = _masked_softmax_parts(logits, mask)
        oc = p @ vcf.unsqueeze(2)  # [B, Hkv, G, C, Dv]
        o[:, t0:t1] = oc.permute(0, 3, 1, 2, 4).reshape(b, t1 - t0, hq, dv)
        lse[:, t0:t1] = lse_c.permute(0, 3, 1, 2).reshape(b, t1 - t0, hq)
        if idx is not None and omega is not None:
            # scores pick blocks (discrete): no gradient, as the reference detaches p_cmp
            s = p.detach().sum(dim=2) @ omega  # [B, Hkv, C, Ts]: group sum, then ω transform
            j = torch.arange(ts, device=dev)[None, :]
            current = pos[:, None] // cfg.sel_block
            eligible = j <= current
            forced = eligible & ((j < cfg.sel_init) | (j > current - cfg.sel_local))
            s = s.masked_fill(forced, float("inf")).masked_fill(~eligible, float("-inf"))
            idx[:, t0:t1] = select_blocks(s.permute(0, 2, 1, 3), pos, cfg)
    return o, lse, idx


def selection_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    idx: torch.Tensor,
    cfg: NSAConfig,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Selection branch over gathered blocks; idx [B,T,Hkv,n] (−1 empty) → o fp32, lse fp32."""
    b, t, hq, _ = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    g = hq // hkv
    n, lp = cfg.sel_count, cfg.sel_block
    dev = q.device
    o = torch.empty((b, t, hq, dv), dtype=torch.float32, device=dev)
    lse = torch.empty((b, t, hq), dtype=torch.float32, device=dev)
    kf = k.float().permute(0, 2, 1, 3)  # [B, Hkv, T, Dk]
    vf = v.float().permute(0, 2, 1, 3)  # [B, Hkv, T, Dv]
    u = torch.arange(lp, device=dev)
    step = _chunk_len(b * hkv * n * lp * max(kf.shape[-1], dv, g), t)
    for t0 in range(0, t, step):
        t1 = min(t, t0 + step)
        c = t1 - t0
        pos = torch.arange(t0, t1, device=dev)
        ib = idx[:, t0:t1].long().permute(0, 2, 1, 3)  # [B, Hkv, C, n]
        tok = ib.unsqueeze(-1) * lp + u  # [B, Hkv, C, n, l′]
        valid = (ib.unsqueeze(-1) >= 0) & (tok <= pos.view(1, 1, c, 1, 1))  # causal in block
        tok = torch.where(valid, tok, torch.zeros_like(tok)).reshape(b, hkv, c * n * lp)
        kg = torch.gather(kf, 2, tok.unsqueeze(-1).expand(-1, -1, -1, kf.shape[-1]))
        vg = torch.gather(vf, 2, tok.unsqueeze(-1).expand(-1, -1, -1, dv))
        kg = kg.view(b, hkv, c, n * lp, -1)  # [B, Hkv, C, N, Dk]
        vg = vg.view(b, hkv, c, n * lp, dv)
        qc = q[:, t0:t1].float().reshape(b, c, hkv, g, -1).permute(0, 2, 1, 3, 4)  # [B,Hkv,C,G,D]
        logits = scale * qc @ kg.transpose(-1, -2)  # [B, Hkv, C, G, N]
        mask = valid.reshape(b, hkv, c, 1, n * lp)
        p, lse_c = _masked_softmax_parts(logits, mask)
        oc = p @ vg  # [B, Hkv, C, G, Dv]
        o[:, t0:t1] = oc.permute(0, 2, 1, 3, 4).reshape(b, c, hq, dv)
        lse[:, t0:t1] = lse_c.permute(0, 2, 1, 3).reshape(b, c, hq)
    return o, lse


def window_torch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: NSAConfig, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding window of w keys including t; returns o [B,T,Hq,Dv] fp32, lse [B,T,Hq] fp32."""
    b, t, hq, _ = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    g = hq // hkv
    w = cfg.window
    dev = q.device
    o = torch.empty((b, t, hq, dv), dtype=torch.float32, device=dev)
    lse = torch.empty((b, t, hq), dtype=torch.float32, device=dev)
    step = _chunk_len(b * hq * (min(w, t) + 256), t)
    step = max(1, min(step, 256))  # keep the key span (step + w) near w
    for t0 in range(0, t, step):
        t1 = min(t, t0 + step)
        k0 = max(0, t0 - w + 1)
        pos = torch.arange(t0, t1, device=dev)
        kpos = torch.arange(k0, t1, device=dev)
        qc = q[:, t0:t1].float().reshape(b, t1 - t0, hkv, g, -1).permute(0, 2, 3, 1, 4)
        kc = k[:, k0:t1].float().permute(0, 2, 1, 3).unsqueeze(2)  # [B, Hkv, 1, K, Dk]
        vc = v[:, k0:t1].float().permute(0, 2, 1, 3).unsqueeze(2)
        logits = scale * qc @ kc.transpose(-1, -2)  # [B, Hkv, G, C, K]
        mask = (kpos[None, :] <= pos[:, None]) & (kpos[None, :] > pos[:, None] - w)
        p, lse_c = _masked_softmax_parts(logits, mask)
        oc = p @ vc  # [B, Hkv, G, C, Dv]
        o[:, t0:t1] = oc.permute(0, 3, 1, 2, 4).reshape(b, t1 - t0, hq, dv)
        lse[:, t0:t1] = lse_c.permute(0, 3, 1, 2).reshape(b, t1 - t0, hq)
    return o, lse
