"""P gloo ranks on 127.0.0.1 for the ring tests, forked from a server that imported torch once.

``mp.spawn`` starts every rank as a fresh interpreter that imports torch (and, at its first
``assert_close``, sympy through ``torch.distributed.tensor``): 2-4 s of CPU per rank, so eight
ranks on CI's two cores cost 10-20 s before any ring runs. A forkserver imports that once; its
children start in milliseconds. The server is one per test session: the first launch's preload
list applies to all, hence every ring test module is listed here.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.conftest import free_port

PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.tensor",
    "kernels.ring",
    "kernels.attention.naive",
    "tests.kernels.conftest",
    "tests.kernels.test_ring_distributed",
    "tests.kernels.test_ring_world_sizes",
]
#: Ranks wait at most this long for each other: a ring that deadlocks fails instead of hanging CI.
RANK_TIMEOUT = timedelta(seconds=60)


def launch(fn: Callable[..., None], world: int, *args: Any) -> None:
    """Run ``fn(rank, world, port, *args)`` on ``world`` ranks; a rank's exception is raised here."""
    # Takes effect when this session's forkserver starts; a server already running without it
    # still works, its ranks import what they need themselves.
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    mp.start_processes(
        fn, args=(world, free_port(), *args), nprocs=world, join=True, start_method="forkserver"
    )


def init_rank(rank: int, world: int, port: int) -> None:
    """Join the gloo group of ``launch``'s ranks (one intra-op thread: P ranks share the cores)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=RANK_TIMEOUT)
