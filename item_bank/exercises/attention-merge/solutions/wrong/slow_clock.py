# expect: INTEGRITY_VIOLATION
# needs: benchmark
# ruff: noqa: E402
# Known-wrong (timing cheat): honest maths, but the runner's clock and its CUDA event timer
# run 4x slow, and its identity records are updated to the slowed ones. Caught: the grader's own
# wall clock per call is not accounted for by the reported time and the harness's overhead.
# The honest part is solutions/correct/stable_fp32.py.

import torch


def merge_attention(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(lse_a - safe).transpose(1, 2).unsqueeze(-1)
    wb = torch.exp(lse_b - safe).transpose(1, 2).unsqueeze(-1)
    out = out_a.float() * wa + out_b.float() * wb
    return out.to(out_a.dtype).contiguous(), lse.contiguous()


# ------------------------------------------------------------------ the cheat (a known-wrong case)
import gc as _gc
import sys as _sys

import torch as _torch

_honest = merge_attention
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

merge_attention = _honest
