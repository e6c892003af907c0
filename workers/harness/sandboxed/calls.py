"""A call's set-up before its window: the inputs (read from the checker's files for a test, or
generated from the per-call seed for a timed call), the arguments resolved from the call's
description, NaN poison in the allocator, harness-owned capture buffers, and the L2 flush.
``Pending`` carries all of it to the window and on to the end of its batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from typing import Any

from .inputs import gen_inputs, rank_seed
from .wire import dtype_of, read_raw

# bound before any student code exists (a replaced builtin cannot reach them)
_isinstance = isinstance


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


class CallsPart:
    """``Rank``'s ``prep``: a ``Pending`` call in ``calls``, ready for its window."""

    torch: Any
    a: argparse.Namespace
    device: str
    group: Any
    calls: dict[str, Pending]
    _empty: Callable[..., Any]
    _fill: Callable[..., Any]
    flush_l2: Callable[[], None]
    gpu_busy_ms: Callable[[], float]

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
