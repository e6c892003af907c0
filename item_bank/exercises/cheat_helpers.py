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


def _shape_key(args) -> tuple:
    return tuple(tuple(a.shape) for a in args if isinstance(a, _torch.Tensor))


# ---------------------------------------------------------------- the cheats, one per class
# Each takes the honest entry function and returns the cheating one (patching the runner as it
# is made, where the cheat does): a cheat file is its header, its includes and one line.


def _lazy_outputs(honest):
    """Unfinished outputs from timed calls, finished when the runner writes them for a check."""
    tmpl: dict = {}
    runner = _main.Rank
    write = runner.write_captures

    def write_captures(self, p):
        if p.msg.get("timed") and p.src is None:
            self.capture(honest(*p.args, **p.kwargs), p)  # the real work, after the window
        return write(self, p)

    runner.write_captures = write_captures
    _rank().ids["Rank.write_captures"] = write_captures

    def entry(*args, **kwargs):
        if not _timed_now(_rank()):
            return honest(*args, **kwargs)
        key = _shape_key(args)
        if key not in tmpl:  # the first timed call of a shape is real: it is always checked
            tmpl[key] = honest(*args, **kwargs)
            return tmpl[key]
        return _unfinished(tmpl[key])

    return entry


def _background_thread(honest):
    """A thread started at import does the real work just after each timed window."""
    import threading
    import time

    jobs: list = []
    go = threading.Event()
    tmpl: dict = {}

    def worker() -> None:
        while True:
            go.wait()
            go.clear()
            time.sleep(0.0002)  # just after the timed window closed
            while jobs:
                out, args, kwargs = jobs.pop()
                _fill(out, honest(*args, **kwargs))

    threading.Thread(target=worker, daemon=True).start()

    def entry(*args, **kwargs):
        if not _timed_now(_rank()):
            return honest(*args, **kwargs)
        key = _shape_key(args)
        if key not in tmpl:
            tmpl[key] = honest(*args, **kwargs)
            return tmpl[key]
        out = _unfinished(tmpl[key])
        jobs.append((out, args, kwargs))
        go.set()
        return out

    return entry


def _slow_clock(honest):
    """Honest maths; the runner's clock and event timer 4x slow, its identity records updated."""
    r = _rank()
    real_perf = _main._perf
    t0 = real_perf()

    def slow_perf() -> float:
        return t0 + (real_perf() - t0) / 4

    _main._perf = slow_perf
    r.ids["runner._perf"] = slow_perf
    if r.device == "cuda":
        real_elapsed = r._elapsed
        r._elapsed = lambda a, b: real_elapsed(a, b) / 4
        r.bound["_elapsed"] = r._elapsed
    return honest


def _gpu_in_flight(honest):
    """~100 ms of GPU work launched right after each timed window, nobody waiting for it."""
    runner = _main.Rank
    window = runner.window
    side = _torch.cuda.Stream() if _torch.cuda.is_available() else None
    a = _torch.randn(4096, 4096, device="cuda") if side is not None else None

    def window_then_load(self, msg):
        rep = window(self, msg)
        p = self.calls.get(msg["id"])
        if side is not None and p is not None and p.msg.get("timed"):
            with _torch.cuda.stream(side):
                for _ in range(60):  # ~100 ms of matmuls, left in flight
                    a @ a
        return rep

    runner.window = window_then_load
    _rank().ids["Rank.window"] = window_then_load
    return honest


def _fill_on_next_call(honest):
    """Each timed call returns unfinished outputs and finishes the previous call's."""
    pending: list = []
    tmpl: dict = {}

    def entry(*args, **kwargs):
        if not _timed_now(_rank()):
            return honest(*args, **kwargs)
        key = _shape_key(args)
        if key not in tmpl:
            tmpl[key] = honest(*args, **kwargs)
            return tmpl[key]
        while pending:  # the previous call's outputs, finished now
            out, a, kw = pending.pop()
            _fill(out, honest(*a, **kw))
        out = _unfinished(tmpl[key])
        pending.append((out, args, kwargs))
        return out

    return entry


def _side_stream(honest):
    """Timed calls' work on a side stream never joined, GPU-bound so the host returns at once."""
    side = _torch.cuda.Stream() if _torch.cuda.is_available() else None
    a = _torch.randn(8192, 8192, device="cuda", dtype=_torch.bfloat16) if side else None

    def entry(*args, **kwargs):
        if side is None or not _timed_now(_rank()):
            return honest(*args, **kwargs)
        side.wait_stream(_torch.cuda.current_stream())  # inputs ready; the outputs never join
        with _torch.cuda.stream(side):
            out = honest(*args, **kwargs)
            for _ in range(4):  # ~4 ms of GPU work, launched in microseconds
                a @ a
            return out

    return entry


def _graph_replay(honest):
    """A CUDA graph of the first timed call of a shape, replayed on later calls."""
    graphs: dict = {}

    def entry(*args, **kwargs):
        if not _torch.cuda.is_available() or not _timed_now(_rank()):
            return honest(*args, **kwargs)
        key = _shape_key(args)
        if key not in graphs:
            s = _torch.cuda.Stream()
            s.wait_stream(_torch.cuda.current_stream())
            with _torch.cuda.stream(s):
                honest(*args, **kwargs)  # warm the allocator on the side, as capture needs
            _torch.cuda.current_stream().wait_stream(s)
            g = _torch.cuda.CUDAGraph()
            with _torch.cuda.graph(g):
                static = honest(*args, **kwargs)
            graphs[key] = (g, static, args)  # the recorded inputs stay alive
        g, static, _ = graphs[key]
        g.replay()
        return static

    return entry
