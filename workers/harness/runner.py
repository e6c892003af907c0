"""Sandboxed runner: the only process that imports student code. This file is its entry script,
the ``Rank`` that answers the parent, and the timed window.

Executed inside the sandbox as ``python -I -P <job>/harness/runner.py ...``, with the
``sandboxed`` package (the rest of the runner, one module per responsibility) copied beside it;
stdlib + torch only, so neither the grader package nor the reference kernels need to be visible
in the sandbox. Everything here is untrusted as soon as the student module is imported: the
parent validates every message against what it asked for, and the trusted checker recomputes
inputs and gold on its own. The runner only makes calls, snapshots outputs through unbound
``torch.Tensor`` methods bound before the import, and reports raw timing samples.

A call, as the parent drives it (``loop``): ``prep`` (``sandboxed/calls.py``: inputs, poison,
capture buffers, flush), ``go`` (``window`` here: the call and the capture of its outputs,
``sandboxed/captures.py``), then ``done`` (``timed_reply`` here: identity checks,
``sandboxed/identity.py``; output digests; descriptions, ``sandboxed/describe.py``), and at the
end of a batch ``emit`` (the chosen calls' captures to files, keyed input digests). A test call
(``call``) is all of these at once.

The window and the clock it reads (``_perf``) stay in this script, the ``__main__`` module: the
item bank's timing cheats reach the runner through ``__main__`` (its ``Rank``, its ``_perf``)
the way a submission could, and the defences are proven against exactly that.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import os
import socket
import subprocess
import sys
import time
import types
from typing import Any

# Bound before any student code exists (timer/type identity is re-checked after each call).
_perf = time.perf_counter
_type = type


def _load_package() -> None:
    """The ``sandboxed`` package beside this script, as the top-level package ``sandboxed``:
    ``python -I`` leaves the script's directory off ``sys.path`` (and nothing should be added
    there that a submission's imports would search), so the package is loaded by path."""
    here = os.path.dirname(os.path.abspath(__file__))
    init = os.path.join(here, "sandboxed", "__init__.py")
    spec = importlib.util.spec_from_file_location(
        "sandboxed", init, submodule_search_locations=[os.path.dirname(init)]
    )
    assert spec is not None and spec.loader is not None
    pkg = importlib.util.module_from_spec(spec)
    sys.modules["sandboxed"] = pkg
    spec.loader.exec_module(pkg)


if not __package__:  # the sandbox's entry script
    _load_package()
_PKG = f"{__package__}.sandboxed" if __package__ else "sandboxed"
(calls, captures, channel, describe, device, digests, identity, importer, inputs, wire) = (
    importlib.import_module(f"{_PKG}.{name}")
    for name in (
        "calls",
        "captures",
        "channel",
        "describe",
        "device",
        "digests",
        "identity",
        "importer",
        "inputs",
        "wire",
    )
)

error_report = channel.error_report

#: The runner's modules, by the short name their identity records use (``identity.py``).
MODULES: dict[str, types.ModuleType] = {
    "runner": sys.modules[__name__],
    "wire": wire,
    "digests": digests,
    "inputs": inputs,
    "channel": channel,
    "importer": importer,
    "device": device,
    "calls": calls,
    "captures": captures,
    "describe": describe,
    "identity": identity,
}

#: Ops the profiler counts in a test call (forbidden attention kernels, the ring's c10d ops).
WATCH_OPS = (
    "c10d::",
    "scaled_dot_product",
    "flash_attention",
    "efficient_attention",
    "cudnn_attention",
    "flex_attention",
)


class Rank(
    channel.ChannelPart,
    importer.ImportPart,
    device.DevicePart,
    calls.CallsPart,
    captures.CapturesPart,
    describe.DescribePart,
):
    """One rank's runner: its state, made of the parts above (one module each), the timed
    window and the message loop."""

    def __init__(self, a: argparse.Namespace) -> None:
        import torch

        self.torch = torch
        self.a = a
        self.device = a.device
        self.sock = socket.socket(fileno=a.fd)
        self.rfile = self.sock.makefile("rb")
        self.fn: Any = None
        self.finder: importer.DenyFinder | None = None
        self.keep: list[Any] = []  # previous call's tensors stay alive: fresh addresses
        self.calls: dict[str, calls.Pending] = {}  # the current batch's calls
        self.weights: dict[tuple[int, int], Any] = {}
        self.digest_tmp: dict[int, Any] = {}  # int32 product buffers for the digests, by size
        self.staging: dict[Any, Any] = {}  # pinned host buffers for the captures, by shape
        self.group: Any = None
        self.flush: Any = None
        self.cudart: Any = None
        self.idle_s = 0.0
        # unbound methods, bound now: a student's subclass/method override cannot reach them
        T = torch.Tensor
        self.T = T
        self._copy = T.copy_
        self._is_contig = T.is_contiguous
        self._stride = T.stride
        self._size = T.size
        self._view = T.view
        self._cpu = T.cpu
        self._detach = T.detach
        self._untyped = T.untyped_storage
        self._ptr = T.data_ptr
        self._fill = T.fill_
        self._empty = torch.empty
        self._gc = (gc.isenabled, gc.disable, gc.enable)
        # the forbidden-op watch, bound before the submission is imported
        self._profiler = torch.autograd.profiler.profile
        self.records = identity.Records(torch, self.device, Rank, WATCHED_METHODS, MODULES)
        self.ids: dict[str, Any] = self.records.current()
        self.stream: Any = None
        self._sync: Any = None
        if self.device == "cuda":
            E = torch.cuda.Event
            torch.cuda.set_device(a.local_device)
            # the timed stream: the one a call starts on (a student's set_stream cannot move it)
            self.stream = torch.cuda.current_stream()
            self._sync = torch.cuda.synchronize
            self._record, self._elapsed, self._esync = E.record, E.elapsed_time, E.synchronize
        self.bound = {k: getattr(self, k, None) for k in BOUND_HELPERS}

    # -- the timed window
    def window(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The timed window: start event, the call, the capture of its outputs, a device-wide
        sync, the end event. The capture's own time (its events) is taken out of the sample."""
        t_in = _perf()
        p = self.calls[msg["id"]]
        cuda = self.device == "cuda"
        prof = None
        if p.msg.get("profile"):
            # The autograd profiler without Kineto: the same RecordFunction events (every aten
            # op by name, those an op calls inside it included), started in milliseconds. The
            # Kineto profiler's first start took 1.2 s on the development CPU, in every job's
            # first test call.
            prof = self._profiler(use_kineto=False)
            prof.__enter__()
        ev = [self.torch.cuda.Event(enable_timing=True) for _ in range(4)] if cuda else None
        err = None
        ret = None
        timed = bool(p.msg.get("timed"))
        # No collector pass inside a timed window (timeit's rule): a host-bound call's time
        # is otherwise at the mercy of garbage the harness made between calls.
        gc_on, gc_off, gc_back = self._gc
        paused = timed and gc_on()
        if paused:
            gc_off()
        tc0 = tc1 = 0.0
        t0 = _perf()
        try:
            if ev:
                self._record(ev[0], self.stream)
            if p.src is None:
                ret = self.fn(*p.args, **p.kwargs)
            if ev:
                self._record(ev[1], self.stream)
            tc0 = _perf()
            with self.torch.cuda.stream(self.stream) if cuda else contextlib.nullcontext():
                p.captured = self.capture(ret, p)
            tc1 = _perf()
            if ev:
                self._record(ev[2], self.stream)
                self._sync()  # device-wide: side-stream work is inside the window
                self._record(ev[3], self.stream)
                self._esync(ev[3])
        except BaseException as e:  # noqa: BLE001
            err = error_report(e)
        t1 = _perf()
        if timed:  # the parent's clock for the call stops here; the digests follow in "done"
            self.send({"t": "ended", "id": p.id})
        if paused:
            gc_back()
        p.ret = ret
        ops: dict[str, int] = {}
        if prof is not None:
            try:
                prof.__exit__(None, None, None)
                for e in prof.function_events:
                    if any(w in e.name for w in WATCH_OPS):
                        ops[e.name] = ops.get(e.name, 0) + 1
            except Exception as e:  # noqa: BLE001
                ops["<profiler error>"] = 1
                err = err or error_report(e)
        res: dict[str, Any] = {"id": p.id, "ok": err is None, "ops": ops}
        res["wall_ms"] = (t1 - t0) * 1e3
        if err is None:
            if ev:
                cap = self._elapsed(ev[1], ev[2])
                res["ev_stream_ms"] = self._elapsed(ev[0], ev[1])
                res["ev_sync_ms"] = max(0.0, self._elapsed(ev[0], ev[3]) - cap)
                res["capture_ms"] = cap
            else:  # CPU: the wall clock is the timer
                cap = (tc1 - tc0) * 1e3
                res["ev_stream_ms"] = res["ev_sync_ms"] = max(0.0, res["wall_ms"] - cap)
                res["capture_ms"] = cap
        # the runner's own time on either side of the window, for operators (the parent's clock
        # covers it, the sample does not)
        res["host_ms"] = {"before": (t0 - t_in) * 1e3, "after": (_perf() - t1) * 1e3}
        return self.timed_reply(p, res, err)

    def timed_reply(
        self, p: calls.Pending, res: dict[str, Any], err: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The window's report: its times, the digests of the captured outputs (committed now,
        before the parent's clock stops), what the outputs are, and the identity checks."""
        t_reply = _perf()
        res["tamper"] = self.tamper_check()
        if err is not None:
            res["error"] = err
            return res
        res["digests"] = self.capture_digests(p)
        res["outputs"] = [] if p.src is not None else self.describe(p.ret, p.msg)
        res["inputs"] = {n: self.describe_input(t, digest=False) for n, t in p.x.items()}
        res["host_ms"]["reply"] = (_perf() - t_reply) * 1e3
        return res

    def tamper_check(self) -> list[str]:
        return self.records.check(self.ids, self, self.bound)

    # -- requests
    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A checked test call: prep, the window, then its captures written and its inputs
        hashed at once."""
        self.prep(msg)
        res = self.window({"id": msg["id"]})
        p = self.calls.pop(msg["id"])
        res["t"] = "called"
        if res["ok"]:
            self.write_captures(p)
            res["inputs"] = {n: self.describe_input(t) for n, t in p.x.items()}
        self.keep = [p.x, p.ret]
        return res

    def loop(self) -> None:
        self.send(
            {"t": "hello", "rank": self.a.rank, "pid": os.getpid(), "torch": self.torch.__version__}
        )
        while True:
            msg = self.recv()
            t = msg.get("t")
            if t == "init_dist":
                try:
                    self.init_dist()
                    self.send({"t": "dist_ready", "ok": True})
                except Exception as e:  # noqa: BLE001
                    self.send({"t": "dist_ready", "ok": False, "error": error_report(e)})
            elif t == "warm":
                try:
                    self.send(self.warm(msg))
                except Exception as e:  # noqa: BLE001
                    self.send({"t": "warm", "ok": False, "error": error_report(e)})
            elif t == "import":
                self.send(self.do_import(msg))
            elif t == "call":
                self.send(self.call(msg))
            elif t == "prep":
                self.send(self.prep(msg))
            elif t == "go":
                self.send({"t": "done", **self.window(msg)})
            elif t == "emit":
                self.send(self.emit(msg))
            elif t == "bye":
                break
        if self.a.world > 1:
            import torch.distributed as dist

            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self.send({"t": "bye"})


# Every method of the runner (its parts' included), and the clocks and events a timed call
# reads: bound when the runner starts and compared after every call (a replaced one is
# tampering). Only raises the bar: the parent's own clock and the committed output digests are
# what a forger must beat.
WATCHED_METHODS = identity.methods(Rank)
BOUND_HELPERS = (
    "_copy",
    "_empty",
    "_record",
    "_elapsed",
    "_esync",
    "_sync",
    "_gc",
    "_profiler",
    "stream",
    "records",
)


def launch(a: argparse.Namespace) -> int:
    """World > 1: one child per rank, each holding only its own channel fd."""
    fds = [int(f) for f in a.fds.split(",")]
    procs = []
    for r, fd in enumerate(fds):
        argv = [
            sys.executable,
            "-I",
            "-P",
            os.path.abspath(__file__),
            "--fd",
            str(fd),
            "--rank",
            str(r),
            "--world",
            str(a.world),
            "--port",
            str(a.port),
            "--device",
            a.device,
            "--job",
            a.job,
            "--local-device",
            str(r if a.device == "cuda" else 0),
            "--dist-timeout",
            str(a.dist_timeout),
        ]
        procs.append(subprocess.Popen(argv, pass_fds=(fd,), close_fds=True))
    for fd in fds:
        os.close(fd)
    rc = 0
    for p in procs:
        rc = p.wait() or rc
    return rc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int)
    ap.add_argument("--fds", default="")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--local-device", type=int, default=0)
    ap.add_argument("--job", default="/job")
    ap.add_argument("--dist-timeout", type=float, default=60.0)
    a = ap.parse_args()
    if a.fds:
        sys.exit(launch(a))
    Rank(a).loop()
    channel.quick_exit(sys.stdout, sys.stderr)  # said bye; the student's output flushed


if __name__ == "__main__":
    main()
