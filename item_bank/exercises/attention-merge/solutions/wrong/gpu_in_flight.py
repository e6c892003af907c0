# expect: INTEGRITY_VIOLATION
# needs: gpu
# ruff: noqa: E402
# Known-wrong (timing cheat): right after each timed window the runner is made to launch
# ~100 ms of GPU work that nobody waits for, so it runs while our reference is timed beside the
# submission and slows it; the runner's identity records are updated to hide the replaced method.
# Caught: our reference's runner finds the GPU busy before its turn, which is charged to the
# submission.
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


_R = _main.Rank
_window = _R.window
_side = _torch.cuda.Stream() if _torch.cuda.is_available() else None
_a = _torch.randn(4096, 4096, device="cuda") if _side is not None else None


def _window_then_load(self, msg):
    rep = _window(self, msg)
    p = self.calls.get(msg["id"])
    if _side is not None and p is not None and p.msg.get("timed"):
        with _torch.cuda.stream(_side):
            for _ in range(60):  # ~100 ms of matmuls, left in flight
                _a @ _a
    return rep


_R.window = _window_then_load
_rank().ids["Rank.window"] = _window_then_load

merge_attention = _honest
