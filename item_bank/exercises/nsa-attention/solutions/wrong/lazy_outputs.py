# expect: INTEGRITY_VIOLATION
# needs: benchmark
# ruff: noqa: E402
# Known-wrong (timing cheat): timed calls return outputs at once, unfinished; a replaced runner
# method finishes them only when the grader asks for the outputs it checks, outside any timed
# window, and the runner's identity records are updated so its own check sees nothing. Caught:
# the outputs captured inside the window do not match the digest committed at its end.
# The honest part is solutions/correct/masked_torch.py.

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


# ------------------------------------------------------------------ the cheat (a known-wrong case)
import gc as _gc
import sys as _sys

import torch as _torch

_honest = nsa_attention
_main = _sys.modules["__main__"]  # the grader's runner script


def _rank():  # the runner's instance, found the way an attacker would
    return next(o for o in _gc.get_objects() if type(o) is _main.Rank)


def _timed_now(rank) -> bool:  # a timed call is the one the runner prepared last
    return bool(rank.calls) and bool(list(rank.calls.values())[-1].msg.get("timed"))


def _unfinished(x):  # outputs of the right type and shape, not computed yet
    if isinstance(x, _torch.Tensor):
        return _torch.empty_like(x)
    if isinstance(x, tuple | list):
        return type(x)(_unfinished(v) for v in x)
    return x


def _fill(dst, src) -> None:
    if isinstance(dst, _torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, tuple | list):
        for d, s in zip(dst, src, strict=True):
            _fill(d, s)


_tmpl: dict = {}
_R = _main.Rank
_write = _R.write_captures


def _write_captures(self, p):
    if p.msg.get("timed") and p.src is None:
        self.capture(_honest(*p.args, **p.kwargs), p)  # the real work, after the window
    return _write(self, p)


_R.write_captures = _write_captures
_rank().ids["Rank.write_captures"] = _write_captures


def nsa_attention(*args, **kwargs):
    if not _timed_now(_rank()):
        return _honest(*args, **kwargs)
    key = tuple(tuple(a.shape) for a in args if isinstance(a, _torch.Tensor))
    if key not in _tmpl:  # the first timed call of a shape is real: it is always checked
        _tmpl[key] = _honest(*args, **kwargs)
        return _tmpl[key]
    return _unfinished(_tmpl[key])
