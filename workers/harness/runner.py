"""Sandboxed runner: the only process that imports student code.

Executed inside the sandbox as ``python -I -P /opt/kgrade/runner.py ...``; self-contained on
purpose (stdlib + torch only), so neither the grader package nor the reference kernels need to
be visible in the sandbox. Everything here is untrusted as soon as the student module is
imported: the parent validates every message against what it asked for, and the trusted checker
recomputes inputs and gold on its own. The runner only makes calls, snapshots outputs through
unbound ``torch.Tensor`` methods bound before the import, and reports raw timing samples.

Channel: one JSON object per line on a socket the parent created and passed as an explicit fd;
stdout/stderr are logs only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import hashlib
import importlib.abc
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

# Bound before any student code exists (timer/type identity is re-checked after each call).
_perf = time.perf_counter
_type = type
_isinstance = isinstance

MAX_LINE = 1 << 20


# --------------------------------------------------------------------------- raw tensor files
# Shared with the trusted checker (which imports this file by path, never student code).


def dtype_of(name: str) -> Any:
    import torch

    return {
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
        "int32": torch.int32,
        "int64": torch.int64,
        "float64": torch.float64,
    }[name]


def raw_view(t: Any) -> memoryview:
    """The little-endian bytes of a contiguous CPU tensor, without a copy (bf16 via an int16
    view: numpy lacks it). Snapshots are written and hashed from this: a 64 MiB output copied
    once more per checked call was a measurable part of a checked call's cost."""
    import torch

    t = t.detach().contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.numpy()).cast("B")


DIGEST_CHUNK = 1 << 24  # words per step: bounds the temporaries on huge inputs


def input_digest(t: Any, key: int) -> str:
    """Keyed fingerprint of a tensor's bytes, computed on the tensor's own device (no host copy).

    Σ_i w_i·h_i mod 2^64 over its 16-bit words w_i, with odd weights h_i mixed from the word index
    and a 63-bit key the parent draws only after the call returned. Changing one word always
    changes the sum (an odd weight is a unit mod 2^64); changes that cancel need the key, which
    no submission code sees. Integer sums wrap identically on every device, so the checker,
    which regenerates the inputs, gets the same value.
    """
    import torch

    x = t.detach().contiguous().reshape(-1)
    if x.numel() == 0:
        return "empty"
    w = x.view(torch.int16) if x.element_size() >= 2 else x.view(torch.uint8)
    k1, k2 = int(key) | 1, (int(key) >> 3) | 1
    total = torch.zeros((), dtype=torch.int64, device=w.device)
    for start in range(0, w.numel(), DIGEST_CHUNK):
        part = w[start : start + DIGEST_CHUNK].to(torch.int64)
        h = torch.arange(start, start + part.numel(), dtype=torch.int64, device=w.device)
        h = h * k1 + k2
        h = (h ^ (h >> 29)) * k2
        h = h | 1
        total += (part * h).sum()
    return f"{int(total) & ((1 << 64) - 1):016x}"


def read_raw(path: str | os.PathLike[str], dtype: str, shape: list[int]) -> Any:
    """A raw file read straight into a new CPU tensor; the size must match exactly."""
    import torch

    t = torch.empty([int(s) for s in shape], dtype=dtype_of(dtype))
    buf = raw_view(t)
    with open(path, "rb") as f:
        n = f.readinto(buf) if len(buf) else 0
        extra = f.read(1)
    if n != len(buf) or extra:
        size = os.path.getsize(path)
        raise ValueError(f"raw tensor has {size} bytes, expected {len(buf)}")
    return t


def gen_tensor(spec: dict[str, Any], seed: int, device: str) -> Any:
    """Timing inputs, made on the device from a per-call seed the parent draws at call time.

    The checker regenerates the same values with this same function to check timed probes.
    """
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    shape = [int(s) for s in spec["shape"]]
    dist = spec.get("dist", "normal")
    if dist == "uniform":
        x = torch.rand(shape, generator=g, device=device, dtype=torch.float32)
    else:
        x = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
    x = x * float(spec.get("scale", 1.0)) + float(spec.get("shift", 0.0))
    return x.to(dtype_of(spec["dtype"]))


# --------------------------------------------------------------------------- the NSA config


@dataclasses.dataclass(frozen=True)
class NSAConfig:
    """Carries kernels.nsa.NSAConfig's fields (the reference package is absent here)."""

    cmp_block: int = 32
    cmp_stride: int = 16
    sel_block: int = 64
    sel_count: int = 16
    sel_init: int = 1
    sel_local: int = 2
    window: int = 512
    scale: float | None = None
    compress: str = "mean"


# --------------------------------------------------------------------------- import policy


class DenyFinder(importlib.abc.MetaPathFinder):
    """Refuses forbidden modules and remembers the attempt (a try/except fallback still loses)."""

    def __init__(self, denied: list[str]) -> None:
        self.denied = denied
        self.hits: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        for d in self.denied:
            if fullname == d or fullname.startswith(d + "."):
                self.hits.append(fullname)
                raise ImportError(f"import of {fullname!r} is not allowed in this exercise")
        return None


WATCH_OPS = (
    "c10d::",
    "scaled_dot_product",
    "flash_attention",
    "efficient_attention",
    "cudnn_attention",
    "flex_attention",
)


# --------------------------------------------------------------------------- the rank process


class Rank:
    def __init__(self, a: argparse.Namespace) -> None:
        import torch

        self.torch = torch
        self.a = a
        self.device = a.device
        self.sock = socket.socket(fileno=a.fd)
        self.rfile = self.sock.makefile("rb")
        self.fn: Any = None
        self.finder: DenyFinder | None = None
        self.keep: list[Any] = []  # previous call's tensors stay alive: fresh addresses
        self.pending: list[Any] = []
        self.group: Any = None
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
        self.ids = {"perf_counter": time.perf_counter, "empty": torch.empty}
        if self.device == "cuda":
            self.ids.update({"Event": torch.cuda.Event, "synchronize": torch.cuda.synchronize})
            torch.cuda.set_device(a.local_device)
            self.flush = None

    # -- channel
    def send(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj) + "\n").encode()
        self.sock.sendall(data)

    def recv(self) -> dict[str, Any]:
        line = self.rfile.readline(MAX_LINE)
        if not line:
            sys.exit(0)
        return json.loads(line)

    # -- phases
    def init_dist(self) -> None:
        if self.a.world <= 1:
            return
        import datetime

        import torch.distributed as dist

        backend = "nccl" if self.device == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{self.a.port}",
            rank=self.a.rank,
            world_size=self.a.world,
            timeout=datetime.timedelta(seconds=self.a.dist_timeout),
        )
        self.group = dist.group.WORLD

    def do_import(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.finder = DenyFinder(list(msg.get("deny", [])))
        sys.meta_path.insert(0, self.finder)
        if msg.get("path_extra"):  # trusted reference runs only: make ``kernels`` importable
            sys.path.insert(0, msg["path_extra"])
        before = set(sys.modules)
        path = msg["path"]
        try:
            spec = importlib.util.spec_from_file_location("submission", path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules["submission"] = mod
            spec.loader.exec_module(mod)
            fn = getattr(mod, msg["entry"], None)
            if not callable(fn):
                return {
                    "t": "imported",
                    "ok": False,
                    "hits": self.finder.hits,
                    "error": {
                        "type": "AttributeError",
                        "msg": f"the submission defines no function {msg['entry']!r}",
                    },
                }
            self.fn = fn
        except BaseException as e:  # noqa: BLE001 - anything the student raises is reported
            return {"t": "imported", "ok": False, "hits": self.finder.hits, "error": _err(e)}
        new = sorted(set(sys.modules) - before)
        denied = [m for m in new for d in msg.get("deny", []) if m == d or m.startswith(d + ".")]
        return {
            "t": "imported",
            "ok": True,
            "hits": self.finder.hits + denied,
            "threads": threading.active_count(),
        }

    def resolve(self, desc: Any, tensors: dict[str, Any]) -> Any:
        if _isinstance(desc, str):
            return tensors[desc]
        t = desc["t"]
        if t == "value":
            return desc["v"]
        if t == "group":
            return self.group
        if t == "nsa_config":
            return NSAConfig(**desc["v"])
        raise ValueError(f"bad argument descriptor {desc!r}")

    def load_inputs(self, msg: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        out = {}
        root = self.a.job
        for name, d in msg.get("files", {}).items():
            t = read_raw(os.path.join(root, d["path"]), d["dtype"], d["shape"])
            out[name] = t.to(self.device) if self.device != "cpu" else t
        for i, (name, spec) in enumerate(sorted(msg.get("gens", {}).items())):
            out[name] = gen_tensor(spec, int(msg["seed"]) + i, self.device)
        _ = torch
        return out

    def poison(self, nbytes: int) -> None:
        """NaN-fill and free a block, so torch.empty / partial writes show as NaN (spec §4)."""
        torch = self.torch
        if nbytes <= 0:
            return
        if self.device == "cuda":
            blk = self._empty((nbytes // 4,), dtype=torch.float32, device="cuda")
            self._fill(blk, float("nan"))
            del blk
        else:
            # malloc reuses freed chunks of the same size: poison blocks sized like the outputs
            for n in self.pending_sizes:
                blk = self._empty((max(1, n // 4),), dtype=torch.float32)
                self._fill(blk, float("nan"))
                del blk

    def flush_l2(self) -> None:
        torch = self.torch
        if self.flush is None:
            l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20))
            self.flush = self._empty(
                (max(2 * l2, 256 << 20) // 4,), dtype=torch.float32, device="cuda"
            )
            try:
                import ctypes

                self.cudart = ctypes.CDLL("libcudart.so")
            except OSError:
                self.cudart = None
        if self.cudart is not None:
            # best effort; the write below flushes anyway
            with contextlib.suppress(Exception):
                self.cudart.cudaCtxResetPersistingL2Cache()
        self.flush.zero_()  # a write of >= 2x L2 on the harness stream
        torch.cuda.synchronize()

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        x = self.load_inputs(msg)
        args = [self.resolve(d, x) for d in msg["args"]]
        kwargs = {k: self.resolve(d, x) for k, d in msg["kwargs"].items()}
        self.pending_sizes = [int(o.get("nbytes", 0)) for o in msg["outputs"]]
        self.poison(int(msg.get("poison", 64 << 20)))
        cuda = self.device == "cuda"
        if cuda and msg.get("flush"):
            self.flush_l2()
        elif cuda:
            torch.cuda.synchronize()
        threads0 = threading.active_count()
        prof = None
        if msg.get("profile"):
            from torch.profiler import ProfilerActivity, profile

            prof = profile(activities=[ProfilerActivity.CPU])
            prof.__enter__()
        ev = None
        if cuda:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        err = None
        ret = None
        # No collector pass inside a timed window (timeit's rule): a host-bound call's time
        # is otherwise at the mercy of garbage the harness made between calls.
        gc_on, gc_off, gc_back = self._gc
        paused = bool(msg.get("timed")) and gc_on()
        if paused:
            gc_off()
        t0 = _perf()
        try:
            if ev:
                ev[0].record()
            ret = self.fn(*args, **kwargs)
            if ev:
                ev[1].record()
                torch.cuda.synchronize()  # device-wide: side-stream work is inside the window
                ev[2].record()
                ev[2].synchronize()
        except BaseException as e:  # noqa: BLE001
            err = _err(e)
        t1 = _perf()
        if paused:
            gc_back()
        ops: dict[str, int] = {}
        if prof is not None:
            try:
                prof.__exit__(None, None, None)
                for e in prof.events():
                    if any(w in e.name for w in WATCH_OPS):
                        ops[e.name] = ops.get(e.name, 0) + 1
            except Exception as e:  # noqa: BLE001
                ops["<profiler error>"] = 1
                err = err or _err(e)
        res: dict[str, Any] = {
            "t": "called",
            "id": msg["id"],
            "ok": err is None,
            "wall_ms": (t1 - t0) * 1e3,
            "threads": [threads0, threading.active_count()],
            "ops": ops,
        }
        if ev and err is None:
            res["ev_stream_ms"] = ev[0].elapsed_time(ev[1])
            res["ev_sync_ms"] = ev[0].elapsed_time(ev[2])
        elif err is None and msg.get("timed"):  # CPU rehearsal: the wall clock is the timer
            res["ev_stream_ms"] = res["ev_sync_ms"] = res["wall_ms"]
        res["tamper"] = self.tamper_check()
        if err is not None:
            res["error"] = err
            return res
        res["outputs"] = self.describe(ret, msg)
        # Timed calls defer the input digests to the snapshot step, which only the parent's
        # (secret, after-the-call) probe decision asks for: copying and hashing every input of
        # every timed call on the host cost more than the timing itself.
        deferred = bool(msg.get("defer_snapshot"))
        res["inputs"] = {n: self.describe_input(t, digest=not deferred) for n, t in x.items()}
        self.keep = [x, ret]  # alive until the next call: the next inputs get new addresses
        self.last = (ret, msg, x)
        if not deferred:
            self.snapshot(ret, msg)
        return res

    def tamper_check(self) -> list[str]:
        torch = self.torch
        now = {"perf_counter": time.perf_counter, "empty": torch.empty}
        if self.device == "cuda":
            now.update({"Event": torch.cuda.Event, "synchronize": torch.cuda.synchronize})
        bad = [k for k, v in self.ids.items() if now.get(k) is not v]
        if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
            bad.append("torch mode stack not empty")
        return bad

    def pick(self, ret: Any, sel: list[Any]) -> Any:
        cur = ret
        for s in sel:
            if _isinstance(s, int):
                if _type(cur) not in (tuple, list) or s >= len(cur):
                    raise LookupError(f"expected a tuple with an element {s}")
                cur = cur[s]
            else:
                cur = cur[s] if _type(cur) is dict else getattr(cur, s)
        return cur

    def describe(self, ret: Any, msg: dict[str, Any]) -> list[dict[str, Any]]:
        torch = self.torch
        outs = []
        for o in msg["outputs"]:
            d: dict[str, Any] = {"name": o["name"]}
            try:
                if msg.get("ret") == "tensor" and o["sel"] == [0]:
                    v = ret
                else:
                    v = self.pick(ret, o["sel"])
            except Exception as e:  # noqa: BLE001
                d["error"] = f"{_type(e).__name__}: {e}"[:300]
                outs.append(d)
                continue
            d["type"] = f"{_type(v).__module__}.{_type(v).__qualname__}"
            d["exact"] = _type(v) is self.T
            if d["exact"]:
                st = self._untyped(v)
                d.update(
                    {
                        "dtype": str(v.dtype).replace("torch.", ""),
                        "shape": list(self._size(v)),
                        "stride": list(self._stride(v)),
                        "device": v.device.type,
                        "contiguous": bool(self._is_contig(v)),
                        "storage": [st.data_ptr(), st.nbytes()],
                        "requires_grad": bool(v.requires_grad),
                    }
                )
            outs.append(d)
        _ = torch
        return outs

    def describe_input(self, t: Any, digest: bool = True, key: int | None = None) -> dict[str, Any]:
        st = self._untyped(t)
        d: dict[str, Any] = {"storage": [st.data_ptr(), st.nbytes()]}
        if key is not None:  # timed calls: keyed, on the device
            with self.torch._C.DisableTorchFunction():
                d["digest"] = input_digest(t, key)
        elif digest:
            snap = self._cpu(self._detach(t))
            d["sha256"] = hashlib.sha256(raw_view(snap)).hexdigest()
        return d

    def snapshot(self, ret: Any, msg: dict[str, Any]) -> None:
        """Copy outputs into harness-owned buffers through unbound methods, then write them."""
        torch = self.torch
        for o in msg["outputs"]:
            try:
                v = (
                    ret
                    if (msg.get("ret") == "tensor" and o["sel"] == [0])
                    else self.pick(ret, o["sel"])
                )
            except Exception:  # noqa: BLE001 - reported by describe()
                continue
            if _type(v) is not self.T:
                continue
            if (
                str(v.dtype).replace("torch.", "") != o["dtype"]
                or list(self._size(v)) != o["shape"]
            ):
                continue
            buf = self._empty(o["shape"], dtype=dtype_of(o["dtype"]), device="cpu")
            with torch._C.DisableTorchFunction():
                self._copy(buf, self._detach(v))
            path = os.path.join(self.a.job, o["path"])
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(raw_view(buf))

    def loop(self) -> None:
        self.send(
            {
                "t": "hello",
                "rank": self.a.rank,
                "pid": os.getpid(),
                "torch": self.torch.__version__,
                "threads": threading.active_count(),
            }
        )
        while True:
            msg = self.recv()
            t = msg.get("t")
            if t == "init_dist":
                try:
                    self.init_dist()
                    self.send({"t": "dist_ready", "ok": True})
                except Exception as e:  # noqa: BLE001
                    self.send({"t": "dist_ready", "ok": False, "error": _err(e)})
            elif t == "import":
                self.send(self.do_import(msg))
            elif t == "call":
                self.send(self.call(msg))
            elif t == "snapshot":
                rep: dict[str, Any] = {"t": "snapped", "id": msg["id"]}
                if msg.get("write") and getattr(self, "last", None):
                    ret, called, x = self.last
                    self.snapshot(ret, called)
                    key = int(msg["key"]) if "key" in msg else None
                    rep["inputs"] = {n: self.describe_input(v, key=key) for n, v in x.items()}
                self.send(rep)
            elif t == "noop":
                x = self.load_inputs(msg)
                t0 = _perf()
                if self.device == "cuda":
                    if msg.get("flush"):
                        self.flush_l2()
                    self.torch.cuda.synchronize()
                self.send({"t": "noop", "wall_ms": (_perf() - t0) * 1e3})
                del x
            elif t == "bye":
                break
        if self.a.world > 1:
            import torch.distributed as dist

            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self.send({"t": "bye"})


def _err(e: BaseException) -> dict[str, Any]:
    import errno

    kind = "error"
    name = _type(e).__name__
    if (
        name in ("MemoryError", "OutOfMemoryError")
        or "out of memory" in str(e).lower()
        or _isinstance(e, OSError)
        and e.errno
        in (errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.EFBIG, errno.ENOSPC)
    ):
        kind = "resource"
    tb = "".join(traceback.format_exception(e))[-3000:]
    return {"type": name, "msg": str(e)[:1000], "tb": tb, "kind": kind}


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


if __name__ == "__main__":
    main()
