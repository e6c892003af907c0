"""Pick a launch configuration by timing each candidate once per shape key.

For kernels whose arguments depend on the configuration (TMA descriptors carry the box shape),
so ``triton.autotune`` cannot re-launch them with only different constexprs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

import triton

C = TypeVar("C")


def fastest(
    cache: dict[Hashable, C], key: Hashable, candidates: Iterable[C], launch: Callable[[C], None]
) -> C:
    """The cached pick for ``key``, else the candidate ``launch`` runs fastest (then cached).

    A candidate that fails to launch (shared memory, registers) is skipped; none launching is
    an error naming the key.
    """
    if key in cache:
        return cache[key]
    timings: list[tuple[float, int, C]] = []
    for i, c in enumerate(candidates):
        try:
            ms = triton.testing.do_bench(lambda c=c: launch(c), warmup=5, rep=20)
        except Exception:  # a config that does not fit this GPU is just skipped
            continue
        timings.append((ms, i, c))
    if not timings:
        raise RuntimeError(f"no candidate configuration could be launched for {key!r}")
    cache[key] = min(timings, key=lambda t: (t[0], t[1]))[2]
    return cache[key]
