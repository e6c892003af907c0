"""The contract between the checker and a problem module, plus the runner call description.

A problem module provides:
  build_cases(ex, secret, nonce) -> list[CaseDef]            public + hidden correctness cases
  materialize(ex, case) -> Call                               inputs, call description, context
  check(ex, case, call, outputs) -> Check                     outputs: per rank {out name: tensor}
  bench_calls(ex) -> list[BenchShape]                         GPU timing shapes (gen specs)
  check_bench(ex, shape, inputs, outputs) -> Check            probe check of a timed call
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from workers.problems.common import DTYPE_NAMES


@dataclass
class CaseDef:
    name: str
    visibility: str  # "visible" (public) or "hidden"
    params: dict[str, Any]
    seed: int


@dataclass
class OutSpec:
    name: str
    sel: list[int | str]  # path into the returned value: tuple index, then attribute/key
    dtype: torch.dtype
    shape: tuple[int, ...]

    def to_msg(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sel": self.sel,
            "dtype": DTYPE_NAMES[self.dtype],
            "shape": list(self.shape),
        }


@dataclass
class Call:
    """One checked call of the entry point, on each of ``len(inputs)`` ranks."""

    inputs: list[dict[str, torch.Tensor]]  # per rank: name -> tensor (written as raw files)
    args: list[str | dict[str, Any]]  # tensor input names, or literal {"t": ...} descriptors
    kwargs: dict[str, str | dict[str, Any]]
    outputs: list[list[OutSpec]]  # per rank
    ret: str = "tuple"  # "tuple" (returns a tuple/list) or "tensor" (returns one tensor)
    context: dict[str, Any] = field(default_factory=dict)  # gold etc.; never leaves the checker


@dataclass
class BenchShape:
    name: str
    params: dict[str, Any]
    gens: dict[str, dict[str, Any]]  # input name -> runner gen spec (shape, dtype, dist)
    args: list[str | dict[str, Any]]
    kwargs: dict[str, str | dict[str, Any]]
    outputs: list[OutSpec]
    ret: str
    flops: float
    bytes: float


def value(v: Any) -> dict[str, Any]:
    return {"t": "value", "v": v}
