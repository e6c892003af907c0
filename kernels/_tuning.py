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

    A candidate that fails to launch (shared memory, registers) is skipped. When none launches,
    the first one's exception is raised, noted with the key: its type tells the caller why (a
    CompilationError when the kernel does not compile with this Triton at all).
    """
    if key in cache:
        return cache[key]
    timings: list[tuple[float, int, C]] = []
    first_error: Exception | None = None
    for i, c in enumerate(candidates):
        try:
            ms = triton.testing.do_bench(lambda c=c: launch(c), warmup=5, rep=20)
        except Exception as exc:  # a config that does not fit this GPU is just skipped
            first_error = first_error or exc
            continue
        timings.append((ms, i, c))
    if not timings:
        if first_error is None:
            raise ValueError(f"no candidate configurations given for {key!r}")
        first_error.add_note(f"no candidate configuration could be launched for {key!r}")
        raise first_error
    cache[key] = min(timings)[2]  # the index breaks ties, so configs are never compared
    return cache[key]
