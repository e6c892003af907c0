"""What a benchmark check's capture costs on its way from the runner's GPU to the checker's:
the device-to-host copy, the file written, read back and copied to the device again, for the
output sizes of the benchmark shapes, through the harness's own functions (``wire``) and the
alternatives weighed against them. Prints one table (median ms over ``--reps``).

Usage (GPU machine): python3 benchmarks/capture_io.py [--dirs /tmp /dev/shm] [--reps 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.harness.sandboxed import wire  # noqa: E402


def _ms(fn: Callable[[], object], sync: bool) -> float:
    if sync:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if sync:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def _write(path: str, buf: torch.Tensor) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(wire.raw_view(buf))


def measure(mb: int, folder: str, reps: int) -> list[tuple[str, float, float]]:
    """(way, runner ms, checker ms) for an ``mb`` MiB bf16 output."""
    n = mb * 2**20 // 2
    g = torch.randn(n, device="cuda").to(torch.bfloat16)  # [n] a captured output
    pinned_out = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    pinned_in = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    path = os.path.join(folder, f"cap_{os.getpid()}.bin")
    rows: dict[str, tuple[list[float], list[float]]] = {}

    def way(name: str, runner: Callable[[], object], checker: Callable[[], object]) -> None:
        r, c = rows.setdefault(name, ([], []))
        r.append(_ms(runner, True))
        c.append(_ms(checker, True))
        os.unlink(path)

    for _ in range(reps):
        # today: a pageable copy, written; read into a new tensor, copied to the device
        way(
            "pageable, file",
            lambda: _write(path, g.cpu()),
            lambda: wire.read_raw(path, "bfloat16", [n]).to("cuda"),
        )
        # staged through pinned buffers the harness keeps (one each side)
        way(
            "pinned, file",
            lambda: (pinned_out.copy_(g), _write(path, pinned_out)),
            lambda: _read_into(path, pinned_in).to("cuda", non_blocking=True),
        )
        # the file mapped on both sides: the copies go straight into and out of the mapping
        way(
            "mapped file",
            lambda: torch.from_file(path, shared=True, size=n, dtype=torch.bfloat16).copy_(g),
            lambda: torch.from_file(path, shared=False, size=n, dtype=torch.bfloat16).to("cuda"),
        )
        # the parts on their own
        r, _ = rows.setdefault("  D2H pageable alone", ([], []))
        r.append(_ms(lambda: g.cpu(), True))
        r, _ = rows.setdefault("  D2H pinned alone", ([], []))
        r.append(_ms(lambda: pinned_out.copy_(g), True))
    return [
        (k, statistics.median(r), statistics.median(c) if c else float("nan"))
        for k, (r, c) in rows.items()
    ]


def _read_into(path: str, t: torch.Tensor) -> torch.Tensor:
    with open(path, "rb") as f:
        f.readinto(wire.raw_view(t))
    return t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64], help="MiB")
    ap.add_argument("--dirs", nargs="+", default=[tempfile.gettempdir(), "/dev/shm"])
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| folder | MiB | way | runner ms | checker ms | total ms |")
    print("|---|---|---|---|---|---|")
    for folder in a.dirs:
        for mb in a.sizes:
            for name, r, c in measure(mb, folder, a.reps):
                tot = r + (c if c == c else 0.0)
                print(f"| {folder} | {mb} | {name} | {r:.1f} | {c:.1f} | {tot:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
