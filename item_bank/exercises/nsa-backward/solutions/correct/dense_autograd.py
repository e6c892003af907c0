# Autograd through a dense masked NSA forward in fp32: the three branches as full [T, T] (or
# [T, Tc]) score matrices with explicit masks, the given block indices as a constant mask.
import math

import torch


def _up(x):  # fp32 maths whatever the input dtype
    return x.float()


def _pool(x, l, d):  # [B, T, H, D] -> [B, Tc, H, D]: means of the blocks [i·d, i·d + l)
    return x.unfold(1, l, d).mean(-1) if x.shape[1] >= l else x[:, :0]


def _attend(q, k, v, mask, scale):
    """q [B, H, Tq, D], k/v [B, H, Tk, D], mask [Tq, Tk] or broadcastable: softmax attention;
    a row without visible keys gives 0 (softmax's NaN there is zeroed, and so is its gradient)."""
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


def _heads(x, G):  # [B, T, Hkv, D] -> [B, Hq, T, D], each KV head shared by its G query heads
    return x.transpose(1, 2).repeat_interleave(G, 1)


def _selection_mask(block_indices, T, lp, G):
    """[B, Hq, T, T]: key j visible to query t iff its block is among t's and j <= t."""
    B, _, Hkv, n = block_indices.shape
    Ts = (T + lp - 1) // lp
    bi = block_indices.long().transpose(1, 2)  # B, Hkv, T, n
    chosen = torch.zeros(B, Hkv, T, Ts + 1, dtype=torch.bool, device=bi.device)
    chosen.scatter_(-1, torch.where(bi < 0, Ts, bi), True)  # -1 -> the spare column Ts
    t = torch.arange(T, device=bi.device)
    causal = t.view(1, -1) <= t.view(-1, 1)
    return (chosen[..., :Ts][..., t // lp] & causal).repeat_interleave(G, 1)


def forward(q, k, v, gates, config, block_indices):
    B, T, Hq, Dk = q.shape
    G = Hq // k.shape[2]
    l, d, lp = config.cmp_block, config.cmp_stride, config.sel_block
    scale = 1.0 / math.sqrt(Dk) if config.scale is None else config.scale
    qh = q.transpose(1, 2)
    t = torch.arange(T, device=q.device)
    kc, vc = _pool(k, l, d), _pool(v, l, d)
    Tc = kc.shape[1]
    vis = (torch.arange(Tc, device=q.device) * d + l - 1).view(1, -1) <= t.view(-1, 1)
    o_cmp = _attend(qh, _heads(kc, G), _heads(vc, G), vis, scale)
    kh, vh = _heads(k, G), _heads(v, G)
    o_slc = _attend(qh, kh, vh, _selection_mask(block_indices, T, lp, G), scale)
    diff = t.view(-1, 1) - t.view(1, -1)
    o_win = _attend(qh, kh, vh, (diff >= 0) & (diff < config.window), scale)
    g = gates.transpose(1, 2)
    return (g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_win).transpose(1, 2)


def nsa_backward(q, k, v, gates, dout, config, block_indices):
    leaves = [_up(x).detach().requires_grad_(True) for x in (q, k, v, gates)]
    with torch.enable_grad():
        out = forward(*leaves, config, block_indices)
        grads = torch.autograd.grad(out, leaves, _up(dout))
    return tuple(g.to(x.dtype) for g, x in zip(grads, (q, k, v, gates), strict=True))
