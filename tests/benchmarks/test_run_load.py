"""benchmarks/load/run_load.py's arithmetic: CPU shares from /proc/stat and the median round."""

from __future__ import annotations

import math

from benchmarks.load import run_load as rl


def _row(target: str, rps: float, p95: float) -> rl.Row:
    return rl.Row(target, rps, rps / 10, p95 / 2, p95, p95 * 1.2, int(rps * 20), 0)


def test_idle_and_steal_shares() -> None:
    # user nice system idle iowait irq softirq steal
    before = [100, 0, 50, 1000, 10, 0, 5, 20]
    after = [700, 0, 150, 1200, 20, 0, 10, 70]
    idle, steal = rl.shares(before, after)
    total = 600 + 100 + 200 + 10 + 5 + 50
    assert math.isclose(idle, 210 / total) and math.isclose(steal, 50 / total)
    assert all(math.isnan(x) for x in rl.shares([], after))


def test_cpu_times_reads_the_machines_counters() -> None:
    t = rl.cpu_times()
    assert len(t) == 8 and sum(t) > 0  # Linux: the CI machine and ours


def test_median_round_per_target_keeps_that_rounds_latencies() -> None:
    rounds = [
        [_row("kgrade-sqlite", 900, 70), _row("bare-flask", 1900, 30)],
        [_row("kgrade-sqlite", 1000, 50), _row("bare-flask", 1700, 35)],
        [_row("kgrade-sqlite", 700, 120), _row("bare-flask", 2000, 28)],
    ]
    kg, bare = rl.median_rows(rounds)
    assert (kg.rps, kg.p95) == (900, 70)
    assert (bare.rps, bare.p95) == (1900, 30)
    # an even count takes the lower middle: a real round, never an average of two
    two = rl.median_rows(rounds[:2])
    assert [r.rps for r in two] == [900, 1700]
