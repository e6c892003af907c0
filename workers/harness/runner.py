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


def digest_weights(n: int, key: int, device: str) -> Any:
    """Odd 15-bit weights per 16-bit word for ``output_digest``, mixed from the word index and a
    key (splitmix64's finaliser in wrapping int64 arithmetic, identical on every device). Odd, so
    a change to any one word changes the sum; below 2^15, so the int64 sum is exact."""
    import torch

    def s64(c: int) -> int:  # a 64-bit constant as the signed int64 torch multiplies by
        return c - (1 << 64) if c >= 1 << 63 else c

    h = torch.arange(n, dtype=torch.int64, device=device) * s64(0x9E3779B97F4A7C15)
    h = h + s64(int(key) & ((1 << 64) - 1))
    h = (h ^ (h >> 30)) * s64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> 27)) * s64(0x94D049BB133111EB)
    h = h ^ (h >> 31)
    return (((h >> 20) & 0x7FFF) | 1).to(torch.int32)


def output_digest(t: Any, weights: Any, tmp: Any = None) -> str:
    """Fingerprint of an output's bytes, taken right after the timed window: Σ w_i·word_i over its
    16-bit words. The runner commits it before the parent stops its clock, so outputs written
    after the window (a lazy or background computation) no longer match what the checker reads.
    Forging it needs the right output, which is the work being timed. ``tmp`` (int32, at least
    as many words): a buffer for the products, so the digest allocates nothing (the caching
    allocator's state after a submission's call would otherwise show in its time)."""
    import torch

    w = t.detach().reshape(-1).view(torch.int16)
    n = w.numel()
    if n == 0:
        return "empty"
    if tmp is None:
        prod = w.to(torch.int32) * weights[:n]
    else:
        prod = torch.mul(w, weights[:n], out=tmp[:n])
    total = prod.sum(dtype=torch.int64)
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


# Keys a gen spec may carry (a typo must fail loudly, not silently fall back to normal values).
GEN_KEYS = frozenset({"shape", "dtype", "dist", "scale", "shift", "mix", "empty", "favour"})
HEAVY = "heavy"  # a "mix" variant: Student-t(3) values instead of the scaled normal ones


def _stream_seed(seed: int, label: str) -> int:
    """A 63-bit generator seed for one named random stream of a call. A keyed hash, not
    ``hash()`` (salted per process) nor ``seed + i`` (neighbouring seeds would share streams):
    runner and checker must derive the very same seeds."""
    d = hashlib.sha256(f"{int(seed)}:{label}".encode()).digest()
    return int.from_bytes(d[:8], "little") >> 1


def rank_seed(seed: int, rank: int) -> int:
    """The seed of one rank's shard in a timed call: rank 0 keeps the call's own, every other
    rank gets its own draw (identical shards would let a ring skip its transfers unseen)."""
    return int(seed) if rank == 0 else _stream_seed(seed, f"rank:{rank}")


def _uniform(shape: list[int], seed: int, device: str) -> Any:
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.rand(shape, generator=g, device=device, dtype=torch.float32)


class SharedDraws:
    """The uniform [0, 1) draws of one call that several tensors reference by key (an empty-row
    mask shared by ``out_a`` and ``lse_a``, a row scale shared by ``lse_a`` and ``lse_b``)."""

    def __init__(self, seed: int, device: str) -> None:
        self.seed, self.device = int(seed), device
        self.draws: dict[str, Any] = {}

    def get(self, key: str, shape: list[int]) -> Any:
        u = self.draws.get(key)
        if u is None:
            u = self.draws[key] = _uniform(
                shape, _stream_seed(self.seed, f"shared:{key}"), self.device
            )
        if list(u.shape) != shape:
            raise ValueError(f"shared draw {key!r} used with shapes {list(u.shape)} and {shape}")
        return u


def _selector(
    sel: dict[str, Any], tshape: list[int], seed: int, label: str, device: str, shared: Any
) -> Any:
    """Uniform draws for a "mix", "empty" or "favour" entry, viewed to broadcast against a tensor
    of shape ``tshape``: one value per index of ``sel["shape"]`` (default: every axis but the
    last, i.e. one per row), mapped onto the tensor's axes ``sel["dims"]`` (default: leading)."""
    shape = [int(s) for s in sel.get("shape", tshape[:-1])]
    dims = [int(d) for d in sel.get("dims", range(len(shape)))]
    if len(dims) != len(shape) or len(set(dims)) != len(dims):
        raise ValueError(f"bad selector dims {dims} for draw shape {shape}")
    if any(tshape[d] != s for d, s in zip(dims, shape, strict=True)):
        raise ValueError(f"draw shape {shape} does not fit tensor shape {tshape} at axes {dims}")
    key = sel.get("key")
    if key is None:
        u = _uniform(shape, _stream_seed(seed, label), device)
    elif shared is None:
        raise ValueError(f"shared draw {key!r} outside gen_inputs")
    else:
        u = shared.get(str(key), shape)
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    view = [1] * len(tshape)
    for i in order:
        view[dims[i]] = shape[i]
    return u.permute(order).reshape(view)


def _heavy(shape: list[int], seed: int, device: str) -> Any:
    """1/sqrt(chi2_3/3): times a standard normal, a Student-t(3) sample (the checker's "heavy")."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    chi = torch.zeros(shape, device=device, dtype=torch.float32)
    for _ in range(3):  # one normal at a time: a [3, *shape] draw would triple the peak memory
        z = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
        chi.addcmul_(z, z)
    return (chi / 3.0).clamp_min(0.05).rsqrt()


def gen_tensor(
    spec: dict[str, Any], seed: int, device: str, shared: SharedDraws | None = None
) -> Any:
    """One timing input, made on the device from a seed the parent draws at call time; the
    checker regenerates it with this same function to check timed probes (same device: the
    same values bit for bit, since every step is elementwise on seeded generators).

    ``spec`` (JSON): ``shape``, ``dtype`` (required) and, applied in this order:

    - ``dist``: base samples, ``"normal"`` (default) or ``"uniform"`` on [0, 1);
      then ``x = sample * scale + shift`` (``scale`` 1, ``shift`` 0 by default).
    - ``mix``: ``{"values": [...], <selector>}``: each row draws one of ``values``: a number
      multiplies its row (after the shift: ``[1, 3, 10]`` with ``shift: 10`` gives
      ``c * (N + 10)``, the merge tests' LSEs), ``"heavy"`` makes the row Student-t(3) values
      (clamped to +-30) scaled and shifted instead. With q and k mixed over
      ``[1, 3, 10, "heavy"]`` every call holds the checker's normal, peaked, large and heavy
      logits at once. Normal base only.
    - ``empty``: ``{"frac": f, "fill": v, <selector>}``: rows whose draw is below ``f`` are set
      to ``v`` (a number or ``"-inf"``): empty attention rows, out 0 and lse -inf.
    - ``favour``: ``{<selector>}``: one channel of the last axis per row is favoured:
      ``0.5 + 0.5 x`` there, ``0.5 x`` elsewhere (NSA gates; uniform base).

    A selector picks which values share a draw: ``shape`` (default: the tensor's shape without
    its last axis, one draw per row), ``dims`` (the tensor axes those map to, in order; default
    the leading ones), and ``key``: without one the draw is the tensor's own; with one it comes
    from ``shared``, so every tensor of the call naming that key sees the same draw (``out_a``
    with ``{"key": "a", "shape": [B, H, T], "dims": [0, 2, 1]}`` and ``lse_a`` with
    ``{"key": "a", "shape": [B, H, T]}`` empty the same rows). Use distinct keys for unrelated
    features: one draw read twice is one event.
    """
    import torch

    bad = set(spec) - GEN_KEYS
    if bad:
        raise ValueError(f"unknown gen spec keys {sorted(bad)}")
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    shape = [int(s) for s in spec["shape"]]
    dist = spec.get("dist", "normal")
    scale, shift = float(spec.get("scale", 1.0)), float(spec.get("shift", 0.0))
    if dist == "uniform":
        n = torch.rand(shape, generator=g, device=device, dtype=torch.float32)
    elif dist == "normal":
        n = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
    else:
        raise ValueError(f"unknown gen dist {dist!r}")
    x = n * scale + shift
    if "mix" in spec:
        if dist != "normal":
            raise ValueError("mix needs the normal base")
        vals = list(spec["mix"]["values"])
        u = _selector(spec["mix"], shape, seed, "mix", device, shared)
        idx = (u * len(vals)).long().clamp_max(len(vals) - 1)
        mult = torch.tensor(
            [1.0 if v == HEAVY else float(v) for v in vals], device=device, dtype=torch.float32
        )
        x = x * mult[idx]
        if HEAVY in vals:
            t = (n * _heavy(shape, _stream_seed(seed, "heavy"), device)).clamp_(-30.0, 30.0)
            x = torch.where(idx == vals.index(HEAVY), t * scale + shift, x)
    if "empty" in spec:
        e = spec["empty"]
        u = _selector(e, shape, seed, "empty", device, shared)
        x = x.masked_fill(u < float(e["frac"]), float(e["fill"]))
    if "favour" in spec:
        u = _selector(spec["favour"], shape, seed, "favour", device, shared)
        c = shape[-1]
        pick = (u * c).long().clamp_max(c - 1)
        chan = torch.arange(c, device=device).view([1] * (len(shape) - 1) + [c])
        x = torch.where(chan == pick, 0.5 + 0.5 * x, 0.5 * x)
    return x.to(dtype_of(spec["dtype"]))


def gen_inputs(gens: dict[str, Any], seed: int, device: str) -> dict[str, Any]:
    """A timed call's inputs from the per-call seed (runner and checker alike): each tensor from
    its own stream, plus the call's shared draws (see ``gen_tensor``)."""
    shared = SharedDraws(seed, device)
    return {
        name: gen_tensor(spec, _stream_seed(seed, f"tensor:{name}"), device, shared)
        for name, spec in sorted(gens.items())
    }


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


@dataclasses.dataclass
class Pending:
    """One call between its inputs (``prep``) and the end of its batch (``emit``): the harness
    keeps its inputs, the submission's return value (fresh addresses for the next calls) and
    the capture of its outputs taken inside the timed window."""

    id: str
    msg: dict[str, Any]
    x: dict[str, Any]
    args: list[Any]
    kwargs: dict[str, Any]
    caps: list[Any]  # harness-owned buffers, one per output (None: nothing to capture into)
    src: list[Any] | None = None  # a null call's stand-in outputs
    ret: Any = None
    captured: list[bool] = dataclasses.field(default_factory=list)


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
        self.calls: dict[str, Pending] = {}  # the current batch's calls
        self.weights: dict[tuple[int, int], Any] = {}
        self.digest_tmp: dict[int, Any] = {}  # int32 product buffers for the digests, by size
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
        self.ids: dict[str, Any] = {
            "time.perf_counter": time.perf_counter,
            "runner._perf": _perf,
            "runner.output_digest": output_digest,
            "torch.empty": torch.empty,
            "Tensor.copy_": T.copy_,
        }
        self.ids.update({f"Rank.{m}": Rank.__dict__[m] for m in WATCHED_METHODS})
        self.stream: Any = None
        self._sync: Any = None
        if self.device == "cuda":
            E = torch.cuda.Event
            self.ids.update(
                {
                    "torch.cuda.Event": E,
                    "Event.record": E.record,
                    "Event.elapsed_time": E.elapsed_time,
                    "Event.synchronize": E.synchronize,
                    "torch.cuda.synchronize": torch.cuda.synchronize,
                }
            )
            torch.cuda.set_device(a.local_device)
            # the timed stream: the one a call starts on (a student's set_stream cannot move it)
            self.stream = torch.cuda.current_stream()
            self._sync = torch.cuda.synchronize
            self._record, self._elapsed, self._esync = E.record, E.elapsed_time, E.synchronize
        self.bound = {k: getattr(self, k, None) for k in BOUND_HELPERS}

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

    def warm(self) -> dict[str, Any]:
        """Start what the runtime starts lazily (the CPU thread pool, the CUDA context, the
        process group's communicators for a ring's neighbours) before the submission is
        imported, so the host's count of this process's threads, taken next, is the baseline
        a submission's own threads are measured against."""
        torch = self.torch
        dev = self.device
        a = torch.randn(256, 256, device=dev)
        (a @ a).sum().item()
        torch.ones(1 << 18, device=dev).mul_(2).sum().item()
        if self.group is not None:
            import torch.distributed as dist

            r, w = self.a.rank, self.a.world
            x = torch.ones(4, device=dev)
            dist.all_reduce(x)
            dist.all_gather([torch.empty_like(x) for _ in range(w)], x)
            got = torch.empty_like(x)
            ops = [
                dist.P2POp(dist.isend, x, (r + 1) % w),
                dist.P2POp(dist.irecv, got, (r - 1) % w),
            ]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            if w == 2:  # the plain send/recv pair a 2-rank ring uses
                if r == 0:
                    dist.send(x, 1)
                    dist.recv(got, 1)
                else:
                    dist.recv(got, 0)
                    dist.send(x, 0)
            dist.barrier()
        if dev == "cuda":
            torch.cuda.synchronize()
            self.flush_l2()
            self.probe_s()
            self.idle_s = sorted(self.probe_s() for _ in range(5))[2]
        return {"t": "warm", "ok": True}

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
        return {"t": "imported", "ok": True, "hits": self.finder.hits + denied}

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
        out = {}
        root = self.a.job
        for name, d in msg.get("files", {}).items():
            t = read_raw(os.path.join(root, d["path"]), d["dtype"], d["shape"])
            out[name] = t.to(self.device) if self.device != "cpu" else t
        if msg.get("gens"):
            seed = rank_seed(int(msg["seed"]), self.a.rank)
            out.update(gen_inputs(msg["gens"], seed, self.device))
        return out

    def poison(self, nbytes: int, sizes: list[int]) -> None:
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
            for n in sizes:
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

    def probe_s(self) -> float:
        """Host wall seconds of a fixed GPU workload and a sync (our reference's runner only)."""
        t0 = _perf()
        for _ in range(2):
            self.flush.add_(0.0)
        self.torch.cuda.synchronize()
        return _perf() - t0

    def gpu_busy_ms(self) -> float:
        """0 if the GPU is ours; else how long the last probe took (ms). A fixed workload runs
        as fast as before the submission's import on an idle GPU, and waits for time slices
        behind another context's kernels. Three slow probes with pauses between them (a lucky
        probe can land right at a slice's start) are needed to call the GPU busy."""
        limit = 1.5 * self.idle_s + 1e-4
        for _ in range(3):
            took = self.probe_s()
            if took <= limit:
                return 0.0
            time.sleep(1e-3)
        return took * 1e3

    def prep(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Everything a call needs before its window: inputs, poison, capture buffers, flush."""
        torch = self.torch
        x = self.load_inputs(msg)
        args = [self.resolve(d, x) for d in msg.get("args", [])]
        kwargs = {k: self.resolve(d, x) for k, d in msg.get("kwargs", {}).items()}
        caps, src = [], None
        for o in msg["outputs"]:
            caps.append(self._empty(o["shape"], dtype=dtype_of(o["dtype"]), device=self.device))
        if msg.get("null"):  # the harness's null call: stand-in outputs to capture from
            src = [
                self._empty(o["shape"], dtype=dtype_of(o["dtype"]), device=self.device)
                for o in msg["outputs"]
            ]
        p = Pending(msg["id"], msg, x, args, kwargs, caps, src)
        self.poison(
            int(msg.get("poison", 64 << 20)), [int(o.get("nbytes", 0)) for o in msg["outputs"]]
        )
        rep: dict[str, Any] = {"t": "ready", "id": msg["id"]}
        if self.device == "cuda":
            if msg.get("flush"):
                self.flush_l2()
            else:
                torch.cuda.synchronize()
            if msg.get("idle_probe"):
                rep["busy_ms"] = self.gpu_busy_ms()
        self.calls[p.id] = p
        return rep

    def capture(self, ret: Any, p: Pending) -> list[bool]:
        """Copy every output into its harness buffer on the timed stream, inside the window,
        through unbound methods; an output of the wrong type, dtype or shape is not captured
        (``describe`` says why)."""
        torch = self.torch
        got = []
        for k, o in enumerate(p.msg["outputs"]):
            if p.src is not None:
                v = p.src[k]
            else:
                try:
                    v = (
                        ret
                        if (p.msg.get("ret") == "tensor" and o["sel"] == [0])
                        else self.pick(ret, o["sel"])
                    )
                except Exception:  # noqa: BLE001 - reported by describe()
                    got.append(False)
                    continue
            ok = (
                _type(v) is self.T
                and str(v.dtype).replace("torch.", "") == o["dtype"]
                and list(self._size(v)) == list(o["shape"])
                and v.device.type == self.device
            )
            if ok:
                with torch._C.DisableTorchFunction():
                    self._copy(p.caps[k], self._detach(v))
            got.append(ok)
        return got

    def window(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The timed window: start event, the call, the capture of its outputs, a device-wide
        sync, the end event. The capture's own time (its events) is taken out of the sample."""
        t_in = _perf()
        p = self.calls[msg["id"]]
        cuda = self.device == "cuda"
        prof = None
        if p.msg.get("profile"):
            from torch.profiler import ProfilerActivity, profile

            prof = profile(activities=[ProfilerActivity.CPU])
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
            err = _err(e)
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
                for e in prof.events():
                    if any(w in e.name for w in WATCH_OPS):
                        ops[e.name] = ops.get(e.name, 0) + 1
            except Exception as e:  # noqa: BLE001
                ops["<profiler error>"] = 1
                err = err or _err(e)
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
        self, p: Pending, res: dict[str, Any], err: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The window's report: its times, the digests of the captured outputs (committed now,
        before the parent's clock stops), what the outputs are, and the identity checks."""
        t_reply = _perf()
        res["tamper"] = self.tamper_check()
        if err is not None:
            res["error"] = err
            return res
        wkey = int(p.msg.get("wkey", 1))
        digests = {}
        for k, o in enumerate(p.msg["outputs"]):
            if p.captured[k]:
                n = self._size(p.caps[k]).numel() * p.caps[k].element_size() // 2
                w = self.weights.get((n, wkey))
                if w is None:
                    if any(k != wkey for _, k in self.weights):
                        self.weights.clear()  # a new shape's key: the last shape's are done
                        self.digest_tmp.clear()
                    w = self.weights[(n, wkey)] = digest_weights(n, wkey, self.device)
                tmp = self.digest_tmp.get(n)
                if tmp is None:
                    tmp = self.digest_tmp[n] = self._empty(
                        (n,), dtype=self.torch.int32, device=self.device
                    )
                with self.torch._C.DisableTorchFunction():
                    digests[o["name"]] = output_digest(p.caps[k], w, tmp)
        res["digests"] = digests
        res["outputs"] = [] if p.src is not None else self.describe(p.ret, p.msg)
        res["inputs"] = {n: self.describe_input(t, digest=False) for n, t in p.x.items()}
        res["host_ms"]["reply"] = (_perf() - t_reply) * 1e3
        return res

    def tamper_check(self) -> list[str]:
        torch = self.torch
        now: dict[str, Any] = {
            "time.perf_counter": time.perf_counter,
            "runner._perf": globals().get("_perf"),
            "runner.output_digest": globals().get("output_digest"),
            "torch.empty": torch.empty,
            "Tensor.copy_": torch.Tensor.copy_,
        }
        now.update({f"Rank.{m}": type(self).__dict__.get(m) for m in WATCHED_METHODS})
        if self.device == "cuda":
            E = torch.cuda.Event
            now.update(
                {
                    "torch.cuda.Event": E,
                    "Event.record": getattr(E, "record", None),
                    "Event.elapsed_time": getattr(E, "elapsed_time", None),
                    "Event.synchronize": getattr(E, "synchronize", None),
                    "torch.cuda.synchronize": torch.cuda.synchronize,
                }
            )
        bad = [k for k, v in self.ids.items() if now.get(k) is not v]
        if _type(self) is not Rank:
            bad.append("runner class")
        bad += [f"Rank.{m} (instance)" for m in WATCHED_METHODS if m in self.__dict__]
        bad += [f"self.{k}" for k, v in self.bound.items() if getattr(self, k, None) is not v]
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

    def write_captures(self, p: Pending) -> None:
        """The captured outputs to the files the parent named (the checker reads only these)."""
        for k, o in enumerate(p.msg["outputs"]):
            if not p.captured or not p.captured[k]:
                continue
            buf = self._cpu(p.caps[k]) if self.device != "cpu" else p.caps[k]
            path = os.path.join(self.a.job, o["path"])
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(raw_view(buf))

    def emit(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A batch's end: the chosen calls' captures to files and their inputs' keyed digests
        (the key drawn after the batch), then the whole batch released."""
        key = int(msg["key"])
        calls = {}
        for cid in msg.get("ids", []):
            p = self.calls.get(cid)
            if p is None:
                continue
            self.write_captures(p)
            calls[cid] = {"inputs": {n: self.describe_input(t, key=key) for n, t in p.x.items()}}
        last = self.calls.get(msg.get("keep", ""))
        self.calls.clear()
        self.keep = [last.x, last.ret] if last is not None else []
        return {"t": "emitted", "calls": calls}

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
                    self.send({"t": "dist_ready", "ok": False, "error": _err(e)})
            elif t == "warm":
                try:
                    self.send(self.warm())
                except Exception as e:  # noqa: BLE001
                    self.send({"t": "warm", "ok": False, "error": _err(e)})
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


# Every method of the runner, and the clocks and events a timed call reads: bound when the
# runner starts and compared after every call (a replaced one is tampering). Only raises the
# bar: the parent's own clock and the committed output digests are what a forger must beat.
WATCHED_METHODS = tuple(k for k, v in Rank.__dict__.items() if callable(v) and k != "__init__")
BOUND_HELPERS = ("_copy", "_empty", "_record", "_elapsed", "_esync", "_sync", "_gc", "stream")


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
