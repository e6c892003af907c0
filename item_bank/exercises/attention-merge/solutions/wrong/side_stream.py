# expect: INTEGRITY_VIOLATION
# needs: gpu
# ruff: noqa: E402
# Known-wrong (timing cheat): timed calls put their work on a side stream that the call never
# joins, GPU-bound (one long launch after the real work) so the host returns at once and events
# on the timed stream see almost nothing. Caught: the device-wide sync before the end event puts
# the work back in the time, and the median timed-stream time against the median device time
# shows the work left the timed stream. (Work launched from Python op by op keeps the host busy
# for most of it: the pipeline's run 12 graded such a version PASS at 0.25x, its time counted.)
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


_side = _torch.cuda.Stream() if _torch.cuda.is_available() else None
_a = _torch.randn(8192, 8192, device="cuda", dtype=_torch.bfloat16) if _side is not None else None


def merge_attention(*args, **kwargs):
    if _side is None or not _timed_now(_rank()):
        return _honest(*args, **kwargs)
    _side.wait_stream(_torch.cuda.current_stream())  # inputs are ready; the outputs never join
    with _torch.cuda.stream(_side):
        out = _honest(*args, **kwargs)
        for _ in range(4):  # ~4 ms of GPU work, launched in microseconds
            _a @ _a
        return out
