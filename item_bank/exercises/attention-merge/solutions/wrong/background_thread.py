# expect: INTEGRITY_VIOLATION
# needs: benchmark
# ruff: noqa: E402
# Known-wrong (timing cheat): a thread started at import does the real work just after each
# timed window; the timed call only hands it the inputs and returns unfinished outputs. Nothing of
# the runner is modified. Caught: the host counts the job's threads against its count before the
# import (and the outputs captured inside the window are unfinished).
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


def merge_attention(*args, **kwargs):
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
