# expect: INTEGRITY_VIOLATION
# needs: benchmark
# ruff: noqa: E402
# Known-wrong (timing cheat): a thread started at import does the real work just after each
# timed window; the timed call only hands it the inputs and returns unfinished outputs. Nothing of
# the runner is modified. Caught: the host counts the job's threads against its count before the
# import (and the outputs captured inside the window are unfinished).
# The honest part is solutions/correct/p2p_ring.py.

import math

import torch
import torch.distributed as dist


def _pos(T, P, r, layout, device):
    if layout == "contiguous":
        return torch.arange(r * T // P, (r + 1) * T // P, device=device)
    if layout == "zigzag":
        c = T // (2 * P)
        return torch.cat(
            [
                torch.arange(r * c, (r + 1) * c, device=device),
                torch.arange((2 * P - 1 - r) * c, (2 * P - r) * c, device=device),
            ]
        )
    return torch.arange(r, T, P, device=device)


def _attend(q, k, v, qpos, kpos, causal, sc):
    G = q.shape[2] // k.shape[2]
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(G, 1)
    vf = v.float().transpose(1, 2).repeat_interleave(G, 1)
    B, H, n = qf.shape[:3]
    # Query chunks keep the fp32 score tile near 1 GiB: at 32k tokens per rank the whole
    # [B, H, n, n] tile would be 128 GiB.
    step = max(1, (1 << 28) // max(1, B * H * kf.shape[2]))
    outs, lses = [], []
    for i in range(0, n, step):
        s = qf[:, :, i : i + step] @ kf.transpose(-1, -2) * sc
        if causal:
            s = s.masked_fill(qpos[i : i + step].view(-1, 1) < kpos.view(1, -1), float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse).unsqueeze(-1))
        outs.append(p @ vf)
        lses.append(lse)
    return torch.cat(outs, 2), torch.cat(lses, 2)  # B,H,Tq,D fp32 ; B,H,Tq


def _merge(o, l, o2, l2):
    lse = torch.logaddexp(l, l2)
    safe = torch.where(torch.isneginf(lse), 0.0, lse)
    return o * torch.exp(l - safe).unsqueeze(-1) + o2 * torch.exp(l2 - safe).unsqueeze(-1), lse


def ring_attention_local(q, k, v, *, causal, group, layout="zigzag", scale=None):
    P = dist.get_world_size(group)
    r = dist.get_rank(group)
    B, n, Hq, D = q.shape
    T = n * P
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    nxt = dist.get_global_rank(group, (r + 1) % P)
    prv = dist.get_global_rank(group, (r - 1) % P)
    qpos = _pos(T, P, r, layout, q.device)
    o = torch.zeros(B, Hq, n, D, device=q.device)
    l = torch.full((B, Hq, n), float("-inf"), device=q.device)
    kv = torch.stack([k, v]).contiguous()
    for step in range(P):
        src = (r - step) % P
        reqs = []
        if step < P - 1:  # post the next transfer before computing on the current block
            buf = torch.empty_like(kv)
            reqs = dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, kv, nxt, group), dist.P2POp(dist.irecv, buf, prv, group)]
            )
        o2, l2 = _attend(q, kv[0], kv[1], qpos, _pos(T, P, src, layout, q.device), causal, sc)
        o, l = _merge(o, l, o2, l2)
        for req in reqs:
            req.wait()
        if step < P - 1:
            kv = buf
    return o.transpose(1, 2).to(q.dtype).contiguous(), l.contiguous()


# ------------------------------------------------------------------ the cheat (a known-wrong case)
import gc as _gc
import sys as _sys

import torch as _torch

_honest = ring_attention_local
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


import threading as _threading
import time as _time

_jobs: list = []
_go = _threading.Event()
_tmpl: dict = {}


def _worker() -> None:
    while True:
        _go.wait()
        _go.clear()
        _time.sleep(0.0002)  # just after the timed window closed
        while _jobs:
            out, args, kwargs = _jobs.pop()
            _fill(out, _honest(*args, **kwargs))


_threading.Thread(target=_worker, daemon=True).start()


def ring_attention_local(*args, **kwargs):
    if not _timed_now(_rank()):
        return _honest(*args, **kwargs)
    key = tuple(tuple(a.shape) for a in args if isinstance(a, _torch.Tensor))
    if key not in _tmpl:
        _tmpl[key] = _honest(*args, **kwargs)
        return _tmpl[key]
    out = _unfinished(_tmpl[key])
    _jobs.append((out, args, kwargs))
    _go.set()
    return out
