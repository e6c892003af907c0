# expect: WRONG_ANSWER
# needs: gpu
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): the first timed call of a shape records a CUDA graph of the
# honest work on that call's inputs; later calls replay it and return its static outputs. Caught:
# every call has new input values (and addresses), so a replay computes an old call's answer.
# include: ../correct/stable_fp32.py
# include: ../../../cheat_helpers.py

import torch as _torch

_honest = merge_attention
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
