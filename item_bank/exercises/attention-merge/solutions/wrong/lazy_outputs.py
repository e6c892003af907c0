# expect: INTEGRITY_VIOLATION
# needs: benchmark
# ruff: noqa: E402
# Known-wrong (timing cheat): timed calls return outputs at once, unfinished; a replaced runner
# method finishes them only when the grader asks for the outputs it checks, outside any timed
# window, and the runner's identity records are updated so its own check sees nothing. Caught:
# the outputs captured inside the window do not match the digest committed at its end.
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


_tmpl: dict = {}
_R = _main.Rank
_write = _R.write_captures


def _write_captures(self, p):
    if p.msg.get("timed") and p.src is None:
        self.capture(_honest(*p.args, **p.kwargs), p)  # the real work, after the window
    return _write(self, p)


_R.write_captures = _write_captures
_rank().ids["Rank.write_captures"] = _write_captures


def merge_attention(*args, **kwargs):
    if not _timed_now(_rank()):
        return _honest(*args, **kwargs)
    key = tuple(tuple(a.shape) for a in args if isinstance(a, _torch.Tensor))
    if key not in _tmpl:  # the first timed call of a shape is real: it is always checked
        _tmpl[key] = _honest(*args, **kwargs)
        return _tmpl[key]
    return _unfinished(_tmpl[key])
