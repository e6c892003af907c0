# expect: INTEGRITY_VIOLATION
# needs: benchmark
# ruff: noqa: E402
# Known-wrong (timing cheat): a thread started at import does the real work just after each
# timed window; the timed call only hands it the inputs and returns unfinished outputs. Nothing of
# the runner is modified. Caught: the host counts the job's threads against its count before the
# import (and the outputs captured inside the window are unfinished).
# The honest part is solutions/correct/dense_fp32.py.

import math

import torch


def block_attention(q, k, v, *, causal, q_offset=0, k_offset=0, scale=None):
    B, Tq, Hq, D = q.shape
    G = Hq // k.shape[2]
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(G, 1)
    vf = v.float().transpose(1, 2).repeat_interleave(G, 1)
    s = qf @ kf.transpose(-1, -2) * sc
    if causal:
        i = torch.arange(Tq, device=q.device).view(-1, 1) + q_offset
        j = torch.arange(k.shape[1], device=q.device).view(1, -1) + k_offset
        s = s.masked_fill(i < j, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse).unsqueeze(-1))
    out = (p @ vf).transpose(1, 2).to(q.dtype).contiguous()
    return out, lse.contiguous()


# ------------------------------------------------------------------ the cheat (a known-wrong case)
import gc as _gc
import sys as _sys

import torch as _torch

_honest = block_attention
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


def block_attention(*args, **kwargs):
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
