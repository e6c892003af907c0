# expect: INTEGRITY_VIOLATION
# needs: gpu
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): honest maths, but the runner's clock and its CUDA event timer
# run 4x slow, and its identity records are updated to the slowed ones. Caught: the grader's own
# wall clock per call is not accounted for by the reported time and the harness's overhead.
# On CPU the rehearsal's calls are too short (well under a millisecond) for the wall clock
# to tell a slowed timer from the host's noise: graded on the GPU.
# include: ../correct/p2p_ring.py
# include: ../../../cheat_helpers.py

import torch as _torch

_honest = ring_attention_local
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

ring_attention_local = _honest
