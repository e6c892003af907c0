"""Where a kernel sits against the H200's roofline (grader spec §5): the floor below which a
time is impossible, and for students the achieved FLOP/s and bytes/s beside the speedup.

A shape's FLOPs and bytes come from its problem module (``BenchShape.flops``/``bytes``: per GPU;
a ring's per rank). The peaks are the datasheet's, above what the hardware reaches (782 TFLOP/s
and 4.3 TB/s measured), so a position is a lower bound on how far from the ceiling a kernel is
and the floor can never refuse an honest time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

PEAK_FLOPS = 990e12  # H200 datasheet dense bf16 (above the measured 782)
PEAK_BYTES = 4.8e12  # H200 datasheet HBM3e (above the measured 4.3)
GPU = "H200"


def floor_ms(flops: float, nbytes: float) -> float:
    """The least time the work can take at the peaks: ``max(FLOPs/peak, bytes/peak)``."""
    return max(flops / PEAK_FLOPS, nbytes / PEAK_BYTES) * 1e3


def position(flops: float, nbytes: float, ms: float) -> dict[str, Any] | None:
    """A kernel taking ``ms`` per call on work of ``flops`` and ``nbytes``: achieved TFLOP/s and
    TB/s, each as a fraction of its peak, the bound that limits it (the larger fraction: compute
    or memory), and ``peak_frac``, that larger fraction (= floor / time: 1.0 is the roofline).
    None for a time that is not positive."""
    if not (ms > 0 and math.isfinite(ms)):
        return None
    s = ms / 1e3
    flops_frac = flops / s / PEAK_FLOPS
    bytes_frac = nbytes / s / PEAK_BYTES
    return {
        "tflops": round(flops / s / 1e12, 3),
        "tbytes_s": round(nbytes / s / 1e12, 4),
        "flops_frac": round(flops_frac, 4),
        "bytes_frac": round(bytes_frac, 4),
        "bound": "compute" if flops_frac >= bytes_frac else "memory",
        "peak_frac": round(max(flops_frac, bytes_frac), 4),
    }


def summary(positions: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The kernel's roofline position over a benchmark's shapes: the geometric mean of each
    shape's ``peak_frac`` (like the speedup, a mean of ratios), with the peaks it is against."""
    fracs = [p["peak_frac"] for p in positions if p and p.get("peak_frac", 0) > 0]
    if not fracs or len(fracs) != len(positions):
        return None
    gm = math.exp(sum(math.log(f) for f in fracs) / len(fracs))
    return {
        "gpu": GPU,
        "peak_tflops": PEAK_FLOPS / 1e12,
        "peak_tbytes_s": PEAK_BYTES / 1e12,
        "peak_frac": round(gm, 4),
    }


def describe(pos: dict[str, Any]) -> str:
    """One shape's position for a student: ``312 TFLOP/s (32 % of 990), 1.21 TB/s (25 % of
    4.8): compute-bound at 32 % of the roofline``."""
    return (
        f"{pos['tflops']:.3g} TFLOP/s ({100 * pos['flops_frac']:.0f} % of "
        f"{PEAK_FLOPS / 1e12:g}), {pos['tbytes_s']:.3g} TB/s ({100 * pos['bytes_frac']:.0f} % of "
        f"{PEAK_BYTES / 1e12:g}): {pos['bound']}-bound at {100 * pos['peak_frac']:.0f} % of the "
        f"{GPU} roofline"
    )


def summary_text(summary: dict[str, Any]) -> str:
    """The summary for a student: ``23 % of the H200 roofline (geomean over shapes)``."""
    return (
        f"{100 * summary['peak_frac']:.0f} % of the {summary.get('gpu', GPU)} roofline "
        "(geomean over shapes)"
    )
