# expect: WRONG_ANSWER
# needs: benchmark
# Known-wrong: the dense fp32 NSA on every shape except the public benchmark shapes
# (spec.yaml, recognised by their exact dimensions and config, as an attacker reading the spec
# would), where the selection and window logits come from an fp16 QK^T (11 significant bits).
# The compressed branch, hence the block scores and the selection, stays exact, so the chosen
# blocks match and only the values are off: with unit-scale q the per-branch LSEs mostly stay
# within 1e-3, on the timed calls' peaked rows (q x3) they do not.
import math
from types import SimpleNamespace

import torch


def _branch(s, mask, v):
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse).unsqueeze(-1))
    return p @ v, lse, p


def nsa(q, k, v, gates, config, *, block_indices=None, return_aux=False, low_precision=False):
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
    kc = (
        torch.stack([kf[:, :, i * d : i * d + l].mean(2) for i in range(Tc)], 2)
        if Tc
        else kf[:, :, :0]
    )
    vc = (
        torch.stack([vf[:, :, i * d : i * d + l].mean(2) for i in range(Tc)], 2)
        if Tc
        else vf[:, :, :0]
    )
    vis = (torch.arange(Tc, device=q.device) * d + l - 1).view(1, -1) <= t.view(-1, 1)
    o_cmp, lse_cmp, p_cmp = _branch(qf @ kc.transpose(-1, -2) * sc, vis, vc)
    Ts = (T + lp - 1) // lp
    if block_indices is None:
        w = torch.zeros(Tc, Ts, device=q.device)
        for i in range(Tc):
            for j in range(Ts):
                w[i, j] = max(0, min(i * d + l, (j + 1) * lp) - max(i * d, j * lp)) / d
        score = (p_cmp @ w).view(B, Hkv, G, T, Ts).sum(2)  # B,Hkv,T,Ts
        cur = (t // lp).view(-1, 1)
        j = torch.arange(Ts, device=q.device).view(1, -1)
        elig = j <= cur
        forced = elig & ((j < config.sel_init) | (j > cur - config.sel_local))
        score = score.masked_fill(~elig, float("-inf")).masked_fill(forced, float("inf"))
        order = torch.sort(score, dim=-1, descending=True, stable=True).indices
        bi = torch.full((B, Hkv, T, n), -1, dtype=torch.long, device=q.device)
        for tt in range(T):
            c = min(n, tt // lp + 1)
            bi[:, :, tt, :c] = torch.sort(order[:, :, tt, :c], -1).values
        block_indices = bi.transpose(1, 2).to(torch.int32)
    bi = block_indices.long().transpose(1, 2)  # B,Hkv,T,n
    chosen = torch.zeros(B, Hkv, T, Ts + 1, dtype=torch.bool, device=q.device)
    chosen.scatter_(-1, torch.where(bi < 0, Ts, bi), True)
    causal = t.view(1, -1) <= t.view(-1, 1)
    smask = (chosen[..., :Ts][..., t // lp] & causal).repeat_interleave(G, 1)
    if low_precision:  # the shortcut: fp16 logits for the two token-level branches
        s_all = (qf.half() @ kf.half().transpose(-1, -2)).float() * sc
    else:
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


# (B, T, Hq, Hkv, D, config) of `benchmark:` and `rehearsal_benchmark:`, all bf16
PAPER = (32, 16, 64, 16, 1, 2, 512)
BENCH_SHAPES = {(1, 8192, 16, 1, 128, PAPER), (1, 112, 2, 1, 16, (16, 8, 16, 3, 1, 1, 24))}


def nsa_attention(q, k, v, gates, config, *, block_indices=None, return_aux=False):
    c = config
    cfg = (c.cmp_block, c.cmp_stride, c.sel_block, c.sel_count, c.sel_init, c.sel_local, c.window)
    key = (q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], cfg)
    low = q.dtype == torch.bfloat16 and key in BENCH_SHAPES
    return nsa(
        q,
        k,
        v,
        gates,
        config,
        block_indices=block_indices,
        return_aux=return_aux,
        low_precision=low,
    )
