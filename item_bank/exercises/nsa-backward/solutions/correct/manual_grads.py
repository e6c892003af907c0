# Explicit gradients, no autograd: per branch the FlashAttention-2 backward on dense masked
# score matrices (dO_c = g_c·dout, D_c = rowsum(dO_c·O_c), dS = P·(dP − D_c)), the gates'
# gradient rowsum(dout·O_c), the GQA group's query heads summed into their KV head, and the
# mean pooling's backward (each pooled block spreads dk̃/l over its l tokens).
# With 16-bit inputs, P and dS are rounded to the input dtype before the dots that take them,
# as a tensor-core kernel feeds them (fp32 accumulation): the checker's tolerance must let a
# kernel with those numerics pass.
import math

import torch


def _pool(x, l, d):  # [B, H, T, D] -> [B, H, Tc, D]
    return x.unfold(2, l, d).mean(-1) if x.shape[2] >= l else x[:, :, :0]


def _unpool(dxc, T, l, d):  # the pooling's backward: [B, H, Tc, D] -> [B, H, T, D]
    B, H, Tc, D = dxc.shape
    dx = dxc.new_zeros(B, H, T, D)
    for u in range(l):  # token i·d + u of block i gets dxc_i / l
        dx[:, :, u : u + (Tc - 1) * d + 1 : d] += dxc / l
    return dx


def _group_sum(x, G):  # [B, Hq, ...] -> [B, Hkv, ...]: a KV head's gradient from its G heads
    return x.unflatten(1, (-1, G)).sum(2)


def _branch(q, k, v, mask, scale, do, low):
    """One masked attention branch and its backward: (o, dq, dk, dv) with k, v per query head.
    ``low``: the operand dtype of the dots taking P and dS (None: fp32)."""
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isneginf(m), 0.0, m)  # empty rows: p = 0, o = 0
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True)
    p = e / torch.where(den == 0, 1.0, den)
    o = p @ v
    delta = (do * o).sum(-1, keepdim=True)
    dp = do @ v.transpose(-1, -2)
    ds = p * (dp - delta)
    if low is not None:
        p, ds = p.to(low).float(), ds.to(low).float()
    dv = p.transpose(-1, -2) @ do
    dq = ds @ k * scale
    dk = ds.transpose(-1, -2) @ q * scale
    return o, dq, dk, dv


def nsa_backward(q, k, v, gates, dout, config, block_indices):
    B, T, Hq, Dk = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    l, d, lp = config.cmp_block, config.cmp_stride, config.sel_block
    scale = 1.0 / math.sqrt(Dk) if config.scale is None else config.scale
    low = q.dtype if q.dtype in (torch.bfloat16, torch.float16) else None
    qf = q.float().transpose(1, 2)  # B, Hq, T, D
    kf = k.float().transpose(1, 2)  # B, Hkv, T, D
    vf = v.float().transpose(1, 2)
    g = gates.float().transpose(1, 2)  # B, Hq, T, 3
    do = dout.float().transpose(1, 2)
    t = torch.arange(T, device=q.device)
    # compressed branch: pooled keys and values, block i visible once complete
    kc, vc = _pool(kf, l, d), _pool(vf, l, d)
    Tc = kc.shape[2]
    vis = (torch.arange(Tc, device=q.device) * d + l - 1).view(1, -1) <= t.view(-1, 1)
    # selection branch: the given blocks' tokens, causal inside the current block
    Ts = (T + lp - 1) // lp
    bi = block_indices.long().transpose(1, 2)  # B, Hkv, T, n
    chosen = torch.zeros(B, Hkv, T, Ts + 1, dtype=torch.bool, device=q.device)
    chosen.scatter_(-1, torch.where(bi < 0, Ts, bi), True)
    causal = t.view(1, -1) <= t.view(-1, 1)
    smask = (chosen[..., :Ts][..., t // lp] & causal).repeat_interleave(G, 1)
    wmask = causal & (t.view(-1, 1) - t.view(1, -1) < config.window)
    dq = torch.zeros_like(qf)
    dk = torch.zeros(B, Hq, T, Dk, device=q.device)
    dv = torch.zeros(B, Hq, T, vf.shape[-1], device=q.device)
    dg = torch.zeros_like(g)
    kh, vh = kf.repeat_interleave(G, 1), vf.repeat_interleave(G, 1)
    kch, vch = kc.repeat_interleave(G, 1), vc.repeat_interleave(G, 1)
    for c, (kk, vv, mask) in enumerate(((kch, vch, vis), (kh, vh, smask), (kh, vh, wmask))):
        o, dq_c, dk_c, dv_c = _branch(qf, kk, vv, mask, scale, g[..., c : c + 1] * do, low)
        dg[..., c] = (do * o).sum(-1)
        dq += dq_c
        if c == 0:
            dk_c, dv_c = _unpool(dk_c, T, l, d), _unpool(dv_c, T, l, d)
        dk += dk_c
        dv += dv_c
    dk, dv = _group_sum(dk, G), _group_sum(dv, G)
    return (
        dq.transpose(1, 2).to(q.dtype),
        dk.transpose(1, 2).to(k.dtype),
        dv.transpose(1, 2).to(v.dtype),
        dg.transpose(1, 2).to(gates.dtype),
    )
