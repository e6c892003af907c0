"""Timing statistics, computed only in the trusted parent from raw samples (grader spec §5)."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

MIN_ITERS = 10
MAX_ITERS = 200
TARGET_REL_SE = 0.005  # stop once the median's relative standard error is below 0.5 %
SHAPE_BUDGET_S = 3.0  # GPU seconds of timed calls per shape
# Wall seconds per shape: for a tiny kernel the per-call harness work (fresh inputs, poisoning,
# L2 flush, IPC, probes) dwarfs the kernel, and the GPU budget alone would never end the loop.
SHAPE_WALL_BUDGET_S = 20.0
# A CPU rehearsal's loop only has to run every step of the GPU path: its times mean nothing.
# 4 s a side: a loop at the clamp floor must reach its floor stop before the wall budget ends it.
REHEARSAL_WALL_BUDGET_S = 4.0
WARMUP_CALLS = 3
WARMUP_MIN_S = 0.05
SIDE_STREAM_RATIO = 0.5  # e_stream < 0.5 * e_sync ...
SIDE_STREAM_MIN_MS = 0.05  # ... above 50 us: work escaped the timed stream
CANARY_TOLERANCE = 0.05  # a job's canary this far from the baseline's: a noisy machine
# A submission whose every call so far took this much longer than clamp x our reference's
# slowest is at the score's floor; the loop stops there (see past_floor).
FLOOR_STOP_MARGIN = 1.25
# ... and already after FLOOR_FAST_ITERS (below) calls a side when every one of them took
# more than FLOOR_FAST_MARGIN x that: a dense torch first attempt at 1,000x our reference's
# time (NSA's known correct solutions take 2 s a call against 2.5 ms) otherwise spent 20 s on
# 10 calls whose score the clamp had already fixed.
FLOOR_FAST_MARGIN = 4.0
HUMAN_REVIEW_FACTOR = 1.2  # below 1.2 x roofline floor: flagged for staff review
# Wall-clock plausibility (grader spec §5): the median call's parent wall time, less the
# harness's per-call overhead O, must be accounted for by its reported time within
# ABS + REL x the reported time. A clock slowed 4x leaves 75 % of every call unaccounted for.
# That is 3x the reported time. CPU rehearsals share two cores with the rest of CI, where an
# honest loop's median call once left 4.5 ms unaccounted for beside 3.6 ms reported (1.25x),
# so a CPU job allows 1 ms + 1.5x: half of what the 4x clock leaves, at any call length.
PLAUSIBLE_ABS_MS = {"cuda": 0.05, "cpu": 1.0}
PLAUSIBLE_REL = {"cuda": 0.1, "cpu": 1.5}
MIN_PLAUSIBLE_CALLS = 5
# The warm-up's last calls that the loop's integrity checks judge with the loop's own (the
# first warm-up call never: it may compile or autotune). Warm-up calls go through the same
# window and clocks as the loop's, and a forged clock forges them too.
WARMUP_JUDGED = WARMUP_CALLS - 1
# The fast floor stop's calls a side: with the judged warm-up calls, what the wall-clock and
# digest-phase checks need to judge, so a forged clock stays an INTEGRITY_VIOLATION at the floor
# too (run 15 stopped NSA's slow_clock cheat after 3 calls with nothing else judged and passed
# it at the floor; e41b3d7 made it 5 loop calls, 2 x 1.4 s more for NSA's dense solutions).
FLOOR_FAST_ITERS = MIN_PLAUSIBLE_CALLS - WARMUP_JUDGED
# The digest phase after a window (its outputs' digests, then the reply) against the null
# call's: a lower quartile more than ABS + REL x that is work done after the window. Work a
# submission moves past the window is there on every call, so it lifts the quartile as much as
# the median; a busy host's stalls (a thread pool's straggler, a collector pass) hit some calls
# only, and a loop's first batch has as few as five calls for a median to hide them in.
REPLY_ABS_MS = {"cuda": 0.25, "cpu": 2.0}
REPLY_REL = {"cuda": 0.75, "cpu": 2.0}


@dataclass
class Stats:
    n: int
    median: float
    mean: float
    std: float
    min: float
    rel_se: float


def rel_se_median(samples: list[float], resamples: int = 200, seed: int = 0) -> float:
    """Bootstrap relative standard error of the median."""
    if len(samples) < 3:
        return math.inf
    rnd = random.Random(seed)
    med = statistics.median(samples)
    boots = [statistics.median(rnd.choices(samples, k=len(samples))) for _ in range(resamples)]
    return statistics.pstdev(boots) / med if med > 0 else math.inf


def stats(samples: list[float]) -> Stats:
    return Stats(
        n=len(samples),
        median=statistics.median(samples),
        mean=statistics.fmean(samples),
        std=statistics.pstdev(samples) if len(samples) > 1 else 0.0,
        min=min(samples),
        rel_se=rel_se_median(samples),
    )


def should_stop(
    samples: list[float],
    spent_s: float,
    wall_s: float = 0.0,
    wall_budget_s: float = SHAPE_WALL_BUDGET_S,
) -> bool:
    """Enough timed calls for one shape: ``spent_s`` GPU seconds and ``wall_s`` wall seconds."""
    n = len(samples)
    if n >= MAX_ITERS:
        return True
    if n < MIN_ITERS:
        return False
    if spent_s >= SHAPE_BUDGET_S or wall_s >= wall_budget_s:
        return True
    # cheap test first (mean SE), bootstrap only when it might be done
    mean = statistics.fmean(samples)
    se_mean = statistics.pstdev(samples) / math.sqrt(n) / mean if mean > 0 else math.inf
    return se_mean < TARGET_REL_SE and rel_se_median(samples) < TARGET_REL_SE


def past_floor(
    sub: list[float], base: list[float], clamp: float, margin: float = FLOOR_STOP_MARGIN
) -> bool:
    """The submission's speedup is at its clamp floor (1/clamp) whatever more calls would show:
    each side has its MIN_ITERS counted calls, and the submission's fastest took more than
    ``clamp * margin`` times our reference's slowest; or each side has FLOOR_FAST_ITERS calls
    and the submission's fastest took more than ``clamp * margin * FLOOR_FAST_MARGIN`` times
    ours' slowest. For a median to cross back, most of the calls still to come would have to
    land beyond every call seen so far on both sides (and, after the fast stop, several times
    beyond).

    Why stop: a slow first attempt (a dense torch version, 10-1000x our reference's time) would
    otherwise run the loop until its wall budget, for a number the clamp throws away. Nothing is
    gained by being stopped here: the score is the lowest there is, and every call of a loop this
    short is checked (a first batch checks up to 4 of its calls).
    """
    if clamp <= 0 or not sub or not base:
        return False
    n = min(len(sub), len(base))
    if n >= MIN_ITERS:
        return min(sub) > clamp * margin * max(base)
    if n >= FLOOR_FAST_ITERS:
        return min(sub) > clamp * margin * FLOOR_FAST_MARGIN * max(base)
    return False


def side_stream_escape(streams_ms: list[float], syncs_ms: list[float]) -> bool:
    """Work escaped the timed stream: the median device-synced time is well above the median
    stream time (SIDE_STREAM_RATIO), and large enough to matter (SIDE_STREAM_MIN_MS)."""
    if not streams_ms or not syncs_ms:
        return False
    t_sync = statistics.median(syncs_ms)
    t_stream = statistics.median(streams_ms)
    return t_sync > SIDE_STREAM_MIN_MS and t_stream < SIDE_STREAM_RATIO * t_sync


def clamp_speedup(t_ref: float, t_sub: float, clamp: float) -> float:
    if t_sub <= 0:
        return clamp
    return min(clamp, max(1.0 / clamp, t_ref / t_sub))


def paired_speedup(ref: list[float], sub: list[float], clamp: float) -> float:
    """A paired loop's speedup: the median over rounds of our reference's call over the
    submission's call in the same round, clamped. Both calls of a round meet the host in the
    same state (they run back to back, in ABBA order), so its drift, which moved merge's short
    calls by 25 % a minute apart on the H200 (docs/perf.md, run 13), cancels in the ratio; the
    ratio of the two medians kept it. Re-scored from the same raw samples, runs 14 and 15's 30
    gradings of our reference against itself read 0.9968-1.0178 this way against 0.9900-1.0262.
    Still a median: it moves only if at least half of the submission's calls are faster."""
    ratios = [r / s for r, s in zip(ref, sub, strict=False) if s > 0]
    if not ratios:
        return clamp
    return min(clamp, max(1.0 / clamp, statistics.median(ratios)))


def geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")


def unexplained_wall_ms(
    events_ms: list[float], walls_ms: list[float], overhead_ms: float, device: str
) -> float | None:
    """The median call's parent wall time the reported time and the harness overhead leave
    unexplained, when that is more than the tolerance; None while the calls are plausible (or
    too few to judge). Medians: one descheduled call is noise, a forged clock shows in all."""
    if len(events_ms) < MIN_PLAUSIBLE_CALLS:
        return None
    kind = "cuda" if device == "cuda" else "cpu"
    reported = statistics.median(events_ms)
    gap = statistics.median(w - e for w, e in zip(walls_ms, events_ms, strict=True)) - overhead_ms
    tol = PLAUSIBLE_ABS_MS[kind] + PLAUSIBLE_REL[kind] * reported
    return gap if gap > tol else None


def slow_reply_ms(replies_ms: list[float], expected_ms: float, device: str) -> float | None:
    """How much longer than ``expected_ms`` the digest phase took on most calls (its lower
    quartile), when that is more than the tolerance; None otherwise (or too few calls)."""
    if len(replies_ms) < MIN_PLAUSIBLE_CALLS:
        return None
    kind = "cuda" if device == "cuda" else "cpu"
    extra = statistics.quantiles(replies_ms, n=4, method="inclusive")[0] - expected_ms
    return extra if extra > REPLY_ABS_MS[kind] + REPLY_REL[kind] * expected_ms else None
