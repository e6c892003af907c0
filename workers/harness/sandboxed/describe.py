"""What the runner says about a call's tensors, for the checker's output contract and input
checks: each output's exact type, dtype, shape, strides, device and storage range (read through
unbound ``torch.Tensor`` methods), each input's storage range and a digest of its bytes. The
checker decides from these (``workers.harness.contract``); the runner judges nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from .digests import input_digest
from .wire import raw_view

# bound before any student code exists (a replaced builtin cannot reach it)
_type = type


class DescribePart:
    """``Rank``'s descriptions of a call's outputs (``describe``) and inputs (``describe_input``)."""

    torch: Any
    T: type
    _size: Callable[..., Any]
    _stride: Callable[..., Any]
    _is_contig: Callable[..., Any]
    _untyped: Callable[..., Any]
    _detach: Callable[..., Any]
    _cpu: Callable[..., Any]
    output_of: Callable[..., Any]

    def describe(self, ret: Any, msg: dict[str, Any]) -> list[dict[str, Any]]:
        outs = []
        for o in msg["outputs"]:
            d: dict[str, Any] = {"name": o["name"]}
            try:
                v = self.output_of(ret, msg, o)
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
