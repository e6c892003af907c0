# expect: INTEGRITY_VIOLATION
# needs: gpu
# ruff: noqa: E402
# Known-wrong (timing cheat): honest maths, but the runner's clock and its CUDA event timer
# run 4x slow, and its identity records are updated to the slowed ones. Caught: the grader's own
# wall clock per call is not accounted for by the reported time and the harness's overhead.
# On CPU the rehearsal's calls are too short (well under a millisecond) for the wall clock
# to tell a slowed timer from the host's noise: graded on the GPU.
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


_r = _rank()
_real_perf = _main._perf
_t0 = _real_perf()


def _slow_perf() -> float:
    return _t0 + (_real_perf() - _t0) / 4


_main._perf = _slow_perf
_r.ids["runner._perf"] = _slow_perf
if _r.device == "cuda":
    _real_elapsed = _r._elapsed
    _r._elapsed = lambda a, b: _real_elapsed(a, b) / 4
    _r.bound["_elapsed"] = _r._elapsed

block_attention = _honest
