# expect: WRONG_ANSWER
# needs: benchmark
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): each timed call returns unfinished outputs and finishes the
# previous call's during its own, so every call's time is about one call's work and every
# output is complete by the time the old harness read it. Caught: the outputs are captured inside
# each call's window, where they are still unfinished.
# include: ../correct/stable_fp32.py
# include: ../../../cheat_helpers.py

import torch as _torch

_honest = merge_attention
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
