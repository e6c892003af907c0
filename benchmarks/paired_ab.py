"""A/B of the paired baseline's design on one GPU: our reference graded as a submission
(reference mode) under variants of the timed loop, interleaved, printing one table.

Variants: ``paired`` (as deployed: fresh runners for the timed calls, each side stopped during
the other's calls, both sides' captures written alike, both runners on one CPU), ``no-pin``
(the same, placement left to the scheduler), ``no-stop`` (neither side stopped). Runs 8 and 9
(docs/perf.md) also had ``asym`` and ``no-restart``, now part of the design. A variant whose own reference grades
away from 1.0 shows where an asymmetry between the two sides comes from.

    python benchmarks/paired_ab.py --exercise attention-merge --reps 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from workers.exercises import load_exercise
from workers.harness import bench, grade, procs

# The fresh runner and the symmetric treatment of both sides are no longer variants: the
# runner's thread baseline is taken before the submission's import (docs/grading.md).
VARIANTS = ("paired", "no-pin", "no-stop")


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    saved = bench.stopped
    pin_env = os.environ.get(procs.TIMING_CPUS_ENV)
    if name == "no-pin":
        os.environ[procs.TIMING_CPUS_ENV] = "off"
    elif name == "no-stop":

        @contextlib.contextmanager
        def not_stopped(job: Any) -> Iterator[None]:
            yield

        bench.stopped = not_stopped  # type: ignore[assignment]
    try:
        yield
    finally:
        bench.stopped = saved
        if pin_env is None:
            os.environ.pop(procs.TIMING_CPUS_ENV, None)
        else:
            os.environ[procs.TIMING_CPUS_ENV] = pin_env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--exercise", action="append", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variant", action="append", choices=VARIANTS)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    variants = args.variant or list(VARIANTS)
    ratios: dict[tuple[str, str], list[float]] = {}  # (exercise, variant): ref/sub per shape
    print(
        f"{'exercise':<16} {'variant':<11} rep {'shape':<22} {'sub_ms':>8} {'ref_ms':>8} "
        f"{'ref/sub':>8} {'relSE':>7} {'rt_sub':>7} {'rt_ref':>7} {'time_s':>7}",
        flush=True,
    )
    for eid in args.exercise:
        src = load_exercise(eid).reference.read_bytes()
        for rep in range(args.reps):
            for v in variants:
                t0 = time.monotonic()
                with variant(v):
                    r = grade(eid, src, device=args.device, trusted=True)
                el = time.monotonic() - t0
                if not r.timings:
                    print(f"{eid:<16} {v:<11} {rep:>3} {r.verdict.value}: {r.output[:160]}")
                    continue
                for t in r.timings:
                    prof = r.details["bench_profile"][t.name]
                    # each side's mean round trip of a plain timed call (the parent's clock)
                    base = (r.details.get("baseline") or {}).get(t.name) or {}
                    rt_sub, rt_ref = prof.get("plain_call_ms", 0), base.get("plain_call_ms", 0)
                    ratio = (t.ref_median_ms or 0) / t.median_ms
                    ratios.setdefault((eid, v), []).append(ratio)
                    print(
                        f"{eid:<16} {v:<11} {rep:>3} {t.name[:22]:<22} {t.median_ms:8.4f} "
                        f"{t.ref_median_ms or 0:8.4f} {ratio:8.4f} {prof.get('rel_se') or 0:7.4f} "
                        f"{rt_sub:7.2f} {rt_ref:7.2f} {el:7.1f}",
                        flush=True,
                    )
    print("\nper exercise and variant: geomean of ref/sub over shapes and reps (1.0 = unbiased)")
    for eid in args.exercise:
        for v in variants:
            rs = ratios.get((eid, v))
            if rs:
                gm = statistics.geometric_mean(rs)
                print(
                    f"  {eid:<16} {v:<11} {gm:.4f}  (min {min(rs):.4f}, max {max(rs):.4f}, "
                    f"n {len(rs)})"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
