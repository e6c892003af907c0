# expect: INTEGRITY_VIOLATION
# needs: gpu
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): right after each timed window the runner is made to launch
# ~100 ms of GPU work that nobody waits for, so it runs while our reference is timed beside the
# submission and slows it; the runner's identity records are updated to hide the replaced method.
# Caught: our reference's runner finds the GPU busy before its turn, which is charged to the
# submission.
# include: ../correct/dense_fp32.py
# include: ../../../cheat_helpers.py

import torch as _torch

_honest = block_attention
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

block_attention = _honest
