"""A side stream per CUDA device for NSA work that need not wait in line.

The backward's compressed dk̃/dṽ kernel runs there (it needs only the forward's tensors and D)
beside the chain of kernels that add into dq, dk, dv. Work on the side starts after
everything the caller's stream had queued, and whoever reads its results waits for it
(``join``). The forward's value checks were tried there too and gained nothing (run 63:
1.00 of the serial forward at 64k, 1.014 at 16k): they stay on the caller's stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

_SIDE: dict[int, torch.cuda.Stream] = {}


def side_stream(dev: torch.device) -> torch.cuda.Stream:
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index not in _SIDE:  # kept: a stream costs a driver call to create
        _SIDE[index] = torch.cuda.Stream(torch.device("cuda", index))
    return _SIDE[index]


@contextmanager
def on_side(dev: torch.device, *uses: torch.Tensor | None) -> Iterator[torch.cuda.Stream]:
    """Launch the block's work on the side stream, after all the caller's stream has queued.

    ``uses``: tensors from the caller's stream that the side reads or writes; their memory is
    not handed out again before the side's work on them is done, even if freed meanwhile.
    """
    side = side_stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        yield side
    for x in uses:
        if x is not None:
            x.record_stream(side)


def join(dev: torch.device) -> None:
    """The caller's stream waits for all the side stream has queued so far."""
    torch.cuda.current_stream(dev).wait_stream(side_stream(dev))
