"""Helpers the known-wrong timing cheats share (item_bank/exercises/*/solutions/wrong/):
each cheat names this file and the correct solution it builds on in ``# include:`` lines, and
the bank inlines both when it hands the cheat to the grader (workers.exercises.Solution.source).
Attacker code on purpose: it finds the grader's runner the way a submission could."""

import gc as _gc
import sys as _sys

import torch as _torch

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
