"""The outputs a call returned, as the harness keeps them: picked out of the return value, copied
inside the timed window into harness-owned buffers through unbound ``torch.Tensor`` methods
(any strides: the buffers are row-major), digested right after the window, and written to the
files the checker reads, at the end of the call's batch. The checker sees only these copies,
never the submission's tensors.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from .calls import Pending
from .digests import digest_weights, output_digest
from .wire import pinned_buffer, raw_view

# bound before any student code exists (a replaced builtin cannot reach them)
_type = type
_isinstance = isinstance
_perf = time.perf_counter
STAGE_MIN_BYTES = 1 << 20


class CapturesPart:
    """``Rank``'s captures: ``capture`` (in the window), ``capture_digests`` (right after it),
    ``write_captures`` and ``emit`` (a batch's end). ``weights``/``digest_tmp``: the digest
    weights of the current shape's key and int32 product buffers, by size, so a digest
    allocates nothing; ``staging``: pinned host buffers the captures are copied through."""

    torch: Any
    a: argparse.Namespace
    device: str
    T: type
    calls: dict[str, Pending]
    keep: list[Any]
    weights: dict[tuple[int, int], Any]
    digest_tmp: dict[int, Any]
    staging: dict[Any, Any]
    _copy: Callable[..., Any]
    _detach: Callable[..., Any]
    _size: Callable[..., Any]
    _cpu: Callable[..., Any]
    _empty: Callable[..., Any]
    describe_input: Callable[..., dict[str, Any]]

    def pick(self, ret: Any, sel: list[Any]) -> Any:
        """The output at ``sel`` (tuple indices, dict keys or attribute names) in ``ret``."""
        cur = ret
        for s in sel:
            if _isinstance(s, int):
                if _type(cur) not in (tuple, list) or s >= len(cur):
                    raise LookupError(f"expected a tuple with an element {s}")
                cur = cur[s]
            else:
                cur = cur[s] if _type(cur) is dict else getattr(cur, s)
        return cur

    def output_of(self, ret: Any, msg: dict[str, Any], o: dict[str, Any]) -> Any:
        """Output ``o`` of a call's return value (a bare tensor for ``ret == "tensor"``)."""
        if msg.get("ret") == "tensor" and o["sel"] == [0]:
            return ret
        return self.pick(ret, o["sel"])

    def capture(self, ret: Any, p: Pending) -> list[bool]:
        """Copy every output into its harness buffer on the timed stream, inside the window,
        through unbound methods; an output of the wrong type, dtype, shape or device is not
        captured (``describe`` says why). ``copy_`` reads any strides, expanded ones included,
        into the row-major buffer: whether those strides are acceptable is the checker's call."""
        torch = self.torch
        got = []
        for k, o in enumerate(p.msg["outputs"]):
            if p.src is not None:
                v = p.src[k]
            else:
                try:
                    v = self.output_of(ret, p.msg, o)
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

    def capture_digests(self, p: Pending) -> dict[str, str]:
        """The digests of the captured outputs, committed before the parent's clock stops, under
        the shape's weight key ``wkey``."""
        wkey = int(p.msg.get("wkey", 1))
        digests = {}
        for k, o in enumerate(p.msg["outputs"]):
            if not p.captured[k]:
                continue
            n = self._size(p.caps[k]).numel() * p.caps[k].element_size() // 2
            w = self.weights.get((n, wkey))
            if w is None:
                if any(key != wkey for _, key in self.weights):
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
        return digests

    def host_copy(self, cap: Any) -> Any:
        """A device capture's bytes on the host, through a pinned buffer from 1 MiB up (each
        check wrote one on both sides; ``wire.pinned_buffer`` says what that saves)."""
        if self._size(cap).numel() * cap.element_size() < STAGE_MIN_BYTES:
            return self._cpu(cap)
        buf = pinned_buffer(self.staging, tuple(self._size(cap)), cap.dtype, self._empty)
        if buf is None:  # no pinned memory to be had here: the pageable copy
            return self._cpu(cap)
        with self.torch._C.DisableTorchFunction():
            self._copy(buf, cap)  # device to pinned host memory: returns once it is there
        return buf

    def write_captures(self, p: Pending) -> None:
        """The captured outputs to the files the parent named (the checker reads only these)."""
        for k, o in enumerate(p.msg["outputs"]):
            if not p.captured or not p.captured[k]:
                continue
            buf = self.host_copy(p.caps[k]) if self.device != "cpu" else p.caps[k]
            path = os.path.join(self.a.job, o["path"])
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(raw_view(buf))

    def emit(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A batch's end: the chosen calls' captures to files and their inputs' keyed digests
        (the key drawn after the batch), then the whole batch released."""
        key = int(msg["key"])
        calls = {}
        # where a batch end's seconds go, for operators only (the parent trusts none of it)
        spent = {"write_ms": 0.0, "digest_ms": 0.0}
        for cid in msg.get("ids", []):
            p = self.calls.get(cid)
            if p is None:
                continue
            t0 = _perf()
            self.write_captures(p)
            t1 = _perf()
            calls[cid] = {"inputs": {n: self.describe_input(t, key=key) for n, t in p.x.items()}}
            spent["write_ms"] += (t1 - t0) * 1e3
            spent["digest_ms"] += (_perf() - t1) * 1e3
        last = self.calls.get(msg.get("keep", ""))
        self.calls.clear()
        self.keep = [last.x, last.ret] if last is not None else []
        return {"t": "emitted", "calls": calls, "spent": spent}
