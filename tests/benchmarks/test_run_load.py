"""benchmarks/load/run_load.py's arithmetic: CPU shares from /proc/stat, a process tree's CPU
from /proc, and the median round."""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


def test_group_cpu_counts_a_process_tree_and_its_grandchildren(tmp_path: Path) -> None:
    """A parent that sleeps and a grandchild that burns 0.4 s of CPU, then says so and
    sleeps: the tree's count holds the burn (a count of the root alone would not)."""
    done = tmp_path / "burnt"
    burn = (
        "import time, pathlib; t = time.process_time()\n"
        "while time.process_time() - t < 0.4: pass\n"
        f"pathlib.Path({str(done)!r}).touch(); time.sleep(30)"
    )
    spawn = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {burn!r}]); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", spawn], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done.exists()
        tree, _ = rl.group_cpu(parent.pid)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    assert 0.4 <= tree < 3.0  # the burn, and two interpreters' start
    assert rl.group_cpu(None)[0] == 0.0


def test_cpu_seconds_of_this_process_and_of_one_that_is_gone() -> None:
    from workers.harness.procs import cpu_seconds

    assert cpu_seconds([os.getpid()]) > 0
    assert cpu_seconds([2**22 + 7]) == 0.0  # no such process


def _args(**kw: object) -> argparse.Namespace:
    base = {"workers": 4, "threads": 1, "server": ["gunicorn"], "users": 16, "seconds": 20}
    return argparse.Namespace(**{**base, **kw})


def test_server_argv_same_workers_threads_and_access_log() -> None:
    args = _args()
    g = rl.server_argv("gunicorn", "bare_app:create_app()", 8123, args)
    assert g[-1] == "bare_app:create_app()" and "--access-logfile" in g
    assert g[g.index("--workers") + 1] == "4" and g[g.index("--threads") + 1] == "1"
    r = rl.server_argv("granian", "service:create_app()", 8123, args)
    assert Path(r[0]).name == "granian" and r[-1] == "service:create_app"
    assert {"--factory", "--access-log"} <= set(r)
    assert r[r.index("--interface") + 1] == "wsgi" and r[r.index("--port") + 1] == "8123"
    assert r[r.index("--workers") + 1] == "4" and r[r.index("--blocking-threads") + 1] == "1"


def test_each_row_is_compared_with_the_bare_app_under_its_own_server(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = _args(server=["gunicorn", "granian"], out=Path("/tmp"))
    rows = [
        _row("kgrade-postgres on gunicorn", 800, 40),
        _row("bare-flask on gunicorn", 2000, 20),
        _row("kgrade-postgres on granian", 1200, 30),
        _row("bare-flask on granian", 4000, 10),
    ]
    rl.print_table(rows, args, "")
    ratios = [
        line.split(" | ")[8]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith(("| kgrade", "| bare"))
    ]
    assert ratios == ["0.40", "1.00", "0.30", "1.00"]
