"""The runner's device housekeeping, none of it inside a timed window: joining the process group
(multi-rank exercises), the warm-up before the submission's import, the L2 flush before each
timed call, and the idle probe our reference's runner takes before its turn.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from typing import Any

# bound before any student code exists; the identity records cover it (``identity.py``)
_perf = time.perf_counter


class DevicePart:
    """``Rank``'s device state: ``group`` (the process group), ``flush`` (the L2 flush buffer),
    ``idle_s`` (a probe's time on an idle GPU)."""

    torch: Any
    a: argparse.Namespace
    device: str
    group: Any
    flush: Any
    cudart: Any
    idle_s: float
    _empty: Callable[..., Any]

    def init_dist(self) -> None:
        if self.a.world <= 1:
            return
        import datetime

        import torch.distributed as dist

        backend = "nccl" if self.device == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{self.a.port}",
            rank=self.a.rank,
            world_size=self.a.world,
            timeout=datetime.timedelta(seconds=self.a.dist_timeout),
        )
        self.group = dist.group.WORLD

    def warm(self, msg: dict[str, Any] | None = None) -> dict[str, Any]:
        """Start what the runtime starts lazily (the CPU thread pool, the CUDA context, the
        process group's communicators for a ring's neighbours) before the submission is
        imported, so the host's count of this process's threads, taken next, is the baseline
        a submission's own threads are measured against. ``autograd`` (exercises whose
        submissions run a backward): one tiny backward too, since the autograd engine starts
        its worker threads (one per visible GPU) at the first backward of the process."""
        torch = self.torch
        dev = self.device
        a = torch.randn(256, 256, device=dev)
        (a @ a).sum().item()
        torch.ones(1 << 18, device=dev).mul_(2).sum().item()
        if msg and msg.get("autograd"):
            with torch.enable_grad():
                x = torch.ones(4, device=dev, requires_grad=True)
                (x * x).sum().backward()
        if self.group is not None:
            import torch.distributed as dist

            r, w = self.a.rank, self.a.world
            x = torch.ones(4, device=dev)
            dist.all_reduce(x)
            dist.all_gather([torch.empty_like(x) for _ in range(w)], x)
            got = torch.empty_like(x)
            ops = [
                dist.P2POp(dist.isend, x, (r + 1) % w),
                dist.P2POp(dist.irecv, got, (r - 1) % w),
            ]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            if w == 2:  # the plain send/recv pair a 2-rank ring uses
                if r == 0:
                    dist.send(x, 1)
                    dist.recv(got, 1)
                else:
                    dist.recv(got, 0)
                    dist.send(x, 0)
            dist.barrier()
        if dev == "cuda":
            torch.cuda.synchronize()
            self.flush_l2()
            self.probe_s()
            self.idle_s = sorted(self.probe_s() for _ in range(5))[2]
        return {"t": "warm", "ok": True}

    def flush_l2(self) -> None:
        torch = self.torch
        if self.flush is None:
            l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20))
            self.flush = self._empty(
                (max(2 * l2, 256 << 20) // 4,), dtype=torch.float32, device="cuda"
            )
            try:
                import ctypes

                self.cudart = ctypes.CDLL("libcudart.so")
            except OSError:
                self.cudart = None
        if self.cudart is not None:
            # best effort; the write below flushes anyway
            with contextlib.suppress(Exception):
                self.cudart.cudaCtxResetPersistingL2Cache()
        self.flush.zero_()  # a write of >= 2x L2 on the harness stream
        torch.cuda.synchronize()

    def probe_s(self) -> float:
        """Host wall seconds of a fixed GPU workload and a sync (our reference's runner only)."""
        t0 = _perf()
        for _ in range(2):
            self.flush.add_(0.0)
        self.torch.cuda.synchronize()
        return _perf() - t0

    def gpu_busy_ms(self) -> float:
        """0 if the GPU is ours; else how long the last probe took (ms). A fixed workload runs
        as fast as before the submission's import on an idle GPU, and waits for time slices
        behind another context's kernels. Three slow probes with pauses between them (a lucky
        probe can land right at a slice's start) are needed to call the GPU busy."""
        limit = 1.5 * self.idle_s + 1e-4
        for _ in range(3):
            took = self.probe_s()
            if took <= limit:
                return 0.0
            time.sleep(1e-3)
        return took * 1e3
