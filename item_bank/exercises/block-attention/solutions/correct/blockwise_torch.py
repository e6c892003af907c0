import math

import torch

TILE = 32


def block_attention(q, k, v, *, causal, q_offset=0, k_offset=0, scale=None):
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    qf = q.float().permute(0, 2, 1, 3)  # B,Hq,Tq,D
    kf = k.float().permute(0, 2, 1, 3).repeat_interleave(G, 1)
    vf = v.float().permute(0, 2, 1, 3).repeat_interleave(G, 1)
    m = torch.full((B, Hq, Tq), float("-inf"), device=q.device)
    l = torch.zeros((B, Hq, Tq), device=q.device)
    acc = torch.zeros((B, Hq, Tq, D), device=q.device)
    qi = torch.arange(Tq, device=q.device).view(-1, 1) + q_offset
    for s in range(0, Tk, TILE):
        e = min(Tk, s + TILE)
        if causal and k_offset + s > q_offset + Tq - 1:
            break  # tiles above the diagonal are skipped
        logits = torch.matmul(qf, kf[:, :, s:e].transpose(-1, -2)) * sc
        if causal:
            kj = torch.arange(s, e, device=q.device).view(1, -1) + k_offset
            logits = logits.masked_fill(~(qi >= kj), float("-inf"))
        m_new = torch.maximum(m, logits.amax(-1))
        m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(logits - m_safe.unsqueeze(-1))
        alpha = torch.exp(m - m_safe)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha.unsqueeze(-1) + torch.matmul(p, vf[:, :, s:e])
        m = m_new
    empty = l == 0
    out = acc / torch.where(empty, torch.ones_like(l), l).unsqueeze(-1)
    lse = torch.where(empty, torch.full_like(m, float("-inf")), m + torch.log(l))
    return out.permute(0, 2, 1, 3).to(q.dtype).contiguous(), lse.contiguous()
