"""The output contract (grader spec §4), judged by the trusted checker from the runner's
description of each output (``sandboxed/describe.py``): exactly ``torch.Tensor``, the expected
dtype, shape and device, strides under which no two elements share memory, and no storage
shared with an input. A violation is TYPE_VIOLATION.

Any strides of that kind are accepted: a transposed or ``einsum`` result is as good as a
contiguous one, since the runner copies every output into its own row-major buffer inside the
window and the checker reads only those copies. Refused are strides that make several elements
one memory location (an ``expand``/broadcast result, stride 0 on an axis longer than one): such
a tensor is not an output one can write to (torch refuses in-place ops on it), and it would let a
kernel write a fraction of the output it is timed for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def shares_memory_within(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether two elements of a tensor with these sizes and strides may be one memory location.

    Axes of size 1 never step; the others, taken by increasing stride, must each step past
    everything the smaller ones reach (``stride >= 1 + Σ smaller stride·(size-1)``). Every layout
    a permutation, transpose, slice or ``einsum`` produces passes; a stride of 0 or a repeated
    stride fails. (Exotic interleaved ``as_strided`` layouts that happen not to overlap fail too:
    the condition is sufficient, which is what a contract needs.)
    """
    if len(shape) != len(stride):
        return True
    if any(int(n) == 0 for n in shape):
        return False  # no elements at all
    reach = 0  # the largest offset the smaller axes reach
    for st, n in sorted((int(st), int(n)) for n, st in zip(shape, stride, strict=True) if n > 1):
        if st <= reach:
            return True
        reach += st * (n - 1)
    return False


def output_violation(
    name: str,
    d: dict[str, Any] | None,
    dtype: str,
    shape: list[int],
    device: str,
    inputs: dict[str, Any],
) -> str | None:
    """Why output ``name`` (the runner's description ``d``) breaks the contract, or None.
    ``inputs``: the call's input descriptions (their ``storage`` ranges)."""
    if d is None or "error" in d:
        why = d.get("error") if d else "missing"
        return f"output {name!r}: {why}"
    if not d.get("exact"):
        return f"output {name!r} is {d.get('type')}, not exactly torch.Tensor"
    if d.get("dtype") != dtype:
        return f"output {name!r} has dtype {d.get('dtype')}, expected {dtype}"
    if d.get("shape") != list(shape):
        return f"output {name!r} has shape {d.get('shape')}, expected {list(shape)}"
    if d.get("device") != device:
        return f"output {name!r} is on {d.get('device')}, expected {device}"
    stride = d.get("stride")
    if not isinstance(stride, list) or shares_memory_within(shape, stride):
        return (
            f"output {name!r} has strides {stride} for shape {list(shape)}: several of its "
            "elements are one memory location (an expanded or broadcast tensor); return a "
            "tensor with memory of its own for every element (e.g. call .contiguous())"
        )
    s0, n0 = d.get("storage", [0, 0])
    for iname, im in inputs.items():
        if iname == name:
            continue  # NSA aux.block_indices may be the given block_indices itself
        s1, n1 = im.get("storage", [0, 0])
        if n0 and n1 and s0 < s1 + n1 and s1 < s0 + n0:
            return f"output {name!r} shares storage with input {iname!r}"
    return None
