# An honest kernel's numerics for bf16 inputs, as the Triton reference runs them on the GPU:
# k̃ held as fp16 hi + lo parts (two tensor-core dots give fp32-accurate QK̃ logits; an fp16 k̃
# alone swaps near-tied block scores and fails stage 3's top-n agreement at T = 8k), ṽ in fp16
# (it only feeds o_cmp). Stage-2 tolerances (|Δlse| ≤ 1e-3, kernels spec) must let it pass.
import math
from types import SimpleNamespace

import torch


def _branch(s, mask, v):
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse).unsqueeze(-1))
    return p @ v, lse, p


def nsa_attention(q, k, v, gates, config, *, block_indices=None, return_aux=False):
    B, T, Hq, Dk = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    l, d, lp, n = config.cmp_block, config.cmp_stride, config.sel_block, config.sel_count
    sc = 1.0 / math.sqrt(Dk) if config.scale is None else config.scale
    qf = q.float().transpose(1, 2)  # B,Hq,T,D
    kf = k.float().transpose(1, 2).repeat_interleave(G, 1)
    vf = v.float().transpose(1, 2).repeat_interleave(G, 1)
    t = torch.arange(T, device=q.device)
    Tc = (T - l) // d + 1 if l <= T else 0
    # block i is the mean of tokens i*d .. i*d+l-1: a strided window view, no Python loop
    kc = kf.unfold(2, l, d).mean(-1) if Tc else kf[:, :, :0]  # B,Hq,Tc,D
    vc = vf.unfold(2, l, d).mean(-1) if Tc else vf[:, :, :0]
    if q.dtype == torch.bfloat16:
        # 16-bit operands for tensor-core dots, as our Triton reference uses (fp16: 3 more
        # mantissa bits than bf16; these values fit its range): k̃ = hi + lo, ṽ rounded.
        kc_hi = kc.half()
        kc = kc_hi.float() + (kc - kc_hi.float()).half().float()
        vc = vc.half().float()
    vis = (torch.arange(Tc, device=q.device) * d + l - 1).view(1, -1) <= t.view(-1, 1)
    o_cmp, lse_cmp, p_cmp = _branch(qf @ kc.transpose(-1, -2) * sc, vis, vc)
    Ts = (T + lp - 1) // lp
    if block_indices is None:
        # w[i, j]: overlap of compressed block i with selection block j, in strides
        ic = torch.arange(Tc, device=q.device).view(-1, 1)
        js = torch.arange(Ts, device=q.device).view(1, -1)
        over = torch.minimum(ic * d + l, (js + 1) * lp) - torch.maximum(ic * d, js * lp)
        w = over.clamp(min=0).float() / d  # Tc,Ts
        score = (p_cmp @ w).view(B, Hkv, G, T, Ts).sum(2)  # B,Hkv,T,Ts
        cur = (t // lp).view(-1, 1)
        j = torch.arange(Ts, device=q.device).view(1, -1)
        elig = j <= cur
        forced = elig & ((j < config.sel_init) | (j > cur - config.sel_local))
        score = score.masked_fill(~elig, float("-inf")).masked_fill(forced, float("inf"))
        order = torch.sort(score, dim=-1, descending=True, stable=True).indices
        # query t keeps its first min(n, t // lp + 1) blocks, ascending, then -1 padding:
        # the unused slots get the sentinel Ts, which sorts last, and become -1
        m = min(n, Ts)
        keep = torch.arange(m, device=q.device).view(1, -1) < (t // lp + 1).view(-1, 1)
        top = torch.where(keep, order[..., :m], Ts).sort(-1).values
        bi = torch.full((B, Hkv, T, n), -1, dtype=torch.long, device=q.device)
        bi[..., :m] = torch.where(top == Ts, -1, top)
        block_indices = bi.transpose(1, 2).to(torch.int32)
    bi = block_indices.long().transpose(1, 2)  # B,Hkv,T,n
    chosen = torch.zeros(B, Hkv, T, Ts + 1, dtype=torch.bool, device=q.device)
    chosen.scatter_(-1, torch.where(bi < 0, Ts, bi), True)
    causal = t.view(1, -1) <= t.view(-1, 1)
    smask = (chosen[..., :Ts][..., t // lp] & causal).repeat_interleave(G, 1)
    s_all = qf @ kf.transpose(-1, -2) * sc
    o_slc, lse_slc, _ = _branch(s_all, smask, vf)
    wmask = causal & (t.view(-1, 1) - t.view(1, -1) < config.window)
    o_win, lse_win, _ = _branch(s_all, wmask.expand_as(s_all), vf)
    g = gates.float().transpose(1, 2)
    out = g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_win
    out = out.transpose(1, 2).to(q.dtype).contiguous()
    if not return_aux:
        return out
    aux = SimpleNamespace(
        block_indices=block_indices.contiguous(),
        lse_cmp=lse_cmp.transpose(1, 2).contiguous(),
        lse_slc=lse_slc.transpose(1, 2).contiguous(),
        lse_win=lse_win.transpose(1, 2).contiguous(),
    )
    return out, aux
