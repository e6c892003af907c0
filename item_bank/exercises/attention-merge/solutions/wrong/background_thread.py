# expect: INTEGRITY_VIOLATION
# needs: benchmark
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): a thread started at import does the real work just after each
# timed window; the timed call only hands it the inputs and returns unfinished outputs. Nothing of
# the runner is modified. Caught: the host counts the job's threads against its count before the
# import (and the outputs captured inside the window are unfinished).
# include: ../correct/stable_fp32.py
# include: ../../../cheat_helpers.py

import threading as _threading
import time as _time

import torch as _torch

_honest = merge_attention

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
