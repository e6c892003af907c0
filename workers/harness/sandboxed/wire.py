"""The raw tensor files between runner and checker: little-endian bytes, no header.

The checker writes a checked call's inputs in this format and the runner its captured outputs;
each side parses a file with the dtype and shape it expects itself (never unpickled).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

#: pinned host buffers kept per shape and dtype; a new shape past this many drops the rest
PINNED_KEPT = 4


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
    """The little-endian bytes of a CPU tensor in row-major order, without a copy when it is
    contiguous (bf16 via an int16 view: numpy lacks it). Snapshots are written and hashed from
    this: a 64 MiB output copied once more per checked call was a measurable part of a checked
    call's cost. Any other strides are copied to row-major first."""
    import torch

    t = t.detach().contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.numpy()).cast("B")


def read_raw(
    path: str | os.PathLike[str], dtype: str, shape: list[int], out: Any | None = None
) -> Any:
    """A raw file read straight into a new CPU tensor (or into ``out``, a contiguous CPU tensor
    of that dtype and shape); the size must match exactly."""
    import torch

    t = torch.empty([int(s) for s in shape], dtype=dtype_of(dtype)) if out is None else out
    buf = raw_view(t)
    with open(path, "rb") as f:
        n = f.readinto(buf) if len(buf) else 0
        extra = f.read(1)
    if n != len(buf) or extra:
        size = os.path.getsize(path)
        raise ValueError(f"raw tensor has {size} bytes, expected {len(buf)}")
    return t


def pinned_buffer(
    cache: dict[Any, Any], shape: tuple[int, ...], dtype: Any, empty: Callable[..., Any]
) -> Any | None:
    """A pinned host buffer of ``shape`` and ``dtype`` from ``cache`` (made with ``empty``, the
    caller's own ``torch.empty``), or None where no pinned memory can be had. Captures cross
    between the runner's GPU and the checker's through these: a 64 MiB pageable copy took
    42-50 ms on the H200 machine, a pinned one 1.3 ms (benchmarks/capture_io.py)."""
    key = (tuple(shape), dtype)
    buf = cache.get(key)
    if buf is None:
        if len(cache) >= PINNED_KEPT:  # a new shape: the old ones are done
            cache.clear()
        try:
            buf = empty(key[0], dtype=dtype, pin_memory=True)
        except RuntimeError:
            return None
        cache[key] = buf
    return buf
