# expect: WRONG_ANSWER
# needs: benchmark
# ruff: noqa: E402
# Known-wrong (timing cheat): each timed call returns unfinished outputs and finishes the
# previous call's during its own, so every call's time is about one call's work and every
# output is complete by the time the old harness read it. Caught: the outputs are captured inside
# each call's window, where they are still unfinished.
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


_pending: list = []
_tmpl: dict = {}


def merge_attention(*args, **kwargs):
    if not _timed_now(_rank()):
        return _honest(*args, **kwargs)
    key = tuple(tuple(a.shape) for a in args if isinstance(a, _torch.Tensor))
    if key not in _tmpl:
        _tmpl[key] = _honest(*args, **kwargs)
        return _tmpl[key]
    while _pending:  # the previous call's outputs, finished now
        out, a, kw = _pending.pop()
        _fill(out, _honest(*a, **kw))
    out = _unfinished(_tmpl[key])
    _pending.append((out, args, kwargs))
    return out
