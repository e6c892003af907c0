# expect: WRONG_ANSWER
# needs: gpu
# ruff: noqa: E402
# Known-wrong (timing cheat): the first timed call of a shape records a CUDA graph of the
# honest work on that call's inputs; later calls replay it and return its static outputs. Caught:
# every call has new input values (and addresses), so a replay computes an old call's answer.
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


_graphs: dict = {}


def merge_attention(*args, **kwargs):
    if not _torch.cuda.is_available() or not _timed_now(_rank()):
        return _honest(*args, **kwargs)
    key = tuple(tuple(a.shape) for a in args if isinstance(a, _torch.Tensor))
    if key not in _graphs:
        s = _torch.cuda.Stream()
        s.wait_stream(_torch.cuda.current_stream())
        with _torch.cuda.stream(s):
            _honest(*args, **kwargs)  # warm the allocator on the side, as graph capture needs
        _torch.cuda.current_stream().wait_stream(s)
        g = _torch.cuda.CUDAGraph()
        with _torch.cuda.graph(g):
            static = _honest(*args, **kwargs)
        _graphs[key] = (g, static, args)  # the recorded inputs stay alive
    g, static, _ = _graphs[key]
    g.replay()
    return static
