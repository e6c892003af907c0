"""The deadline benchmark's pure parts (benchmarks/deadline.py): the mix, the plan, the
statistics and the sizing formula. No API, no grading."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dl() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deadline", ROOT / "benchmarks/deadline.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["deadline"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


# --- the mix and the plan --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "mix", "want"),
    [
        (200, "0.5,0.2,0.3", (100, 40, 60)),
        (6, "0.5,0.2,0.3", (3, 1, 2)),  # 3 / 1.2 / 1.8: the last one goes to the largest rest
        (7, "0.5,0.2,0.3", (4, 1, 2)),  # 3.5 / 1.4 / 2.1
        (1, "0.34,0.33,0.33", (1, 0, 0)),
        (5, "0,0,1", (0, 0, 5)),
    ],
)
def test_counts_sum_to_n_within_one_of_each_share(
    dl: ModuleType, n: int, mix: str, want: tuple[int, int, int]
) -> None:
    m = dl.Mix.parse(mix)
    counts = m.counts(n)
    assert tuple(counts[k] for k in dl.KINDS) == want
    assert all(abs(counts[k] - n * m.fraction(k)) < 1 for k in dl.KINDS)


@pytest.mark.parametrize("bad", ["0.5,0.5", "0.6,0.3,0.3", "-0.1,0.6,0.5", "a,b,c"])
def test_a_mix_must_be_three_fractions_summing_to_one(dl: ModuleType, bad: str) -> None:
    with pytest.raises(ValueError):
        dl.Mix.parse(bad)


POOL = {
    ("a", "correct"): ["correct/x", "correct/y"],
    ("a", "slow"): ["correct/x", "correct/y"],
    ("a", "wrong"): ["wrong/p"],
    ("b", "correct"): ["correct/z"],
    ("b", "slow"): ["correct/z"],
    ("b", "wrong"): [],  # e.g. only GPU cheats, on CPU
}


def test_plan_follows_the_mix_and_spreads_over_exercises(dl: ModuleType) -> None:
    picks = dl.plan(40, dl.Mix(0.5, 0.2, 0.3), ["a", "b"], POOL, seed=1)
    assert Counter(p.kind for p in picks) == {"correct": 20, "slow": 8, "wrong": 12}
    by = Counter((p.exercise, p.kind) for p in picks)
    assert by["a", "correct"] == by["b", "correct"] == 10
    assert by["a", "slow"] == by["b", "slow"] == 4
    assert by["a", "wrong"] == 12 and by["b", "wrong"] == 0  # b has none to draw
    assert all(p.solution in POOL[p.exercise, p.kind] for p in picks)


def test_plan_is_seeded_and_shuffled(dl: ModuleType) -> None:
    mix = dl.Mix(0.5, 0.2, 0.3)
    one = dl.plan(30, mix, ["a", "b"], POOL, seed=7)
    assert one == dl.plan(30, mix, ["a", "b"], POOL, seed=7)
    assert one != dl.plan(30, mix, ["a", "b"], POOL, seed=8)
    assert [p.kind for p in one] != sorted((p.kind for p in one), key=dl.KINDS.index)


def test_plan_without_any_solution_of_a_kind_is_an_error(dl: ModuleType) -> None:
    with pytest.raises(ValueError, match="no wrong solution"):
        dl.plan(4, dl.Mix(0.5, 0.0, 0.5), ["b"], POOL, seed=1)


def test_gpu_cheats_only_on_cuda_benchmark_ones_where_the_loop_runs(dl: ModuleType) -> None:
    assert dl.shown_on(None, "cpu", False)
    assert not dl.shown_on("benchmark", "cpu", False)
    assert dl.shown_on("benchmark", "cpu", True) and dl.shown_on("benchmark", "cuda", False)
    assert not dl.shown_on("gpu", "cpu", True) and dl.shown_on("gpu", "cuda", False)
    wrong = dl.pools(["attention-merge"], "cpu", False)["attention-merge", "wrong"]
    assert "wrong/zeros" in wrong and "wrong/side_stream" not in wrong
    assert "wrong/lazy_outputs" not in wrong


def test_slow_correct_repeats_the_whole_call_and_returns_the_last(dl: ModuleType) -> None:
    calls: list[int] = []
    src = "def f(x, *, k=1):\n    calls.append(x)\n    return x * k\n"
    ns: dict[str, Any] = {"calls": calls}
    exec(dl.slow_source(src, "f", 3), ns)  # our own source: the wrapper, run for real
    assert ns["f"](2, k=5) == 10 and calls == [2, 2, 2]


def test_jobs_carry_kind_expected_verdict_and_distinct_sources(dl: ModuleType) -> None:
    picks = [
        dl.Pick("attention-merge", "correct", "correct/stable_fp32"),
        dl.Pick("attention-merge", "slow", "correct/stable_fp32"),
        dl.Pick("attention-merge", "wrong", "wrong/zeros"),
    ]
    jobs = dl.make_jobs(picks, 3)
    assert [(j.kind, j.name, j.expected) for j in jobs] == [
        ("correct", "correct/stable_fp32", "PASS"),
        ("slow", "slow/stable_fp32x3", "PASS"),
        ("wrong", "wrong/zeros", "WRONG_ANSWER"),
    ]
    assert "range(3)" in jobs[1].source and "range(3)" not in jobs[0].source
    assert len({j.source for j in jobs}) == 3


# --- workers ---------------------------------------------------------------------------------


def test_workers_sharing_gpus_are_poured_one_width_at_a_time(dl: ModuleType) -> None:
    two = dl.parse_workers("gpu:0 gpu:1 gpu-x2:0,1")
    assert two == [("gpu", (0,)), ("gpu", (1,)), ("gpu-x2", (0, 1))]
    assert dl.shared_gpus(two) and dl.slot_count(two, "cuda", 2) == 2
    assert dl.default_exercises(two)[-1] == "ring-attention"
    apart = dl.parse_workers("gpu:0 gpu:1 gpu-x2:2,3")
    assert not dl.shared_gpus(apart) and dl.slot_count(apart, "cuda", 4) == 4
    cpu = dl.parse_workers("cpu:")
    assert not dl.shared_gpus(cpu) and dl.slot_count(cpu, "cpu", 4) == 1
    assert "ring-attention" not in dl.default_exercises(cpu)


# --- statistics and sizing -------------------------------------------------------------------


def test_percentile_interpolates_between_ranks(dl: ModuleType) -> None:
    xs = [10.0, 1.0, 4.0, 3.0, 2.0]
    assert dl.percentile(xs, 50) == 3.0
    assert dl.percentile(xs, 0) == 1.0 and dl.percentile(xs, 100) == 10.0
    assert dl.percentile(xs, 95) == pytest.approx(4 + 0.8 * 6)
    assert dl.percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        dl.percentile([], 50)


def test_timing_from_the_servers_stamps(dl: ModuleType) -> None:
    job = dl.DeadlineJob("ring-attention", "correct/p2p_ring", "PASS", "", 2)
    job.extra = {
        "created_at": "2026-12-01T10:00:00+00:00",
        "started_at": "2026-12-01T10:00:30+00:00",
        "finished_at": "2026-12-01T10:02:00.500000+00:00",
    }
    pour = dl.ts("2026-12-01T09:59:50+00:00")
    t = dl.timing(job, pour, "cuda")
    assert (t.latency_s, t.queued_s, t.held_s, t.from_pour_s) == (120.5, 30.0, 90.5, 130.5)
    assert t.slot_s == 181.0  # two GPUs held
    assert dl.timing(job, pour, "cpu").slot_s == 90.5  # one worker slot
    job.extra["finished_at"] = None
    assert dl.timing(job, pour, "cuda") is None


def test_nvidia_smi_samples_averaged_per_gpu_within_the_drain(dl: ModuleType) -> None:
    lines = ["0, 40", "1, 100", "0, 60", "1, [N/A]", "", "0, 99"]
    parsed = [dl.parse_smi_line(x) for x in lines]
    assert parsed[:3] == [(0, 40.0), (1, 100.0), (0, 60.0)] and parsed[3] is parsed[4] is None
    samples = [(1.0, 0, 40.0), (1.0, 1, 100.0), (2.0, 0, 60.0), (9.0, 0, 99.0)]
    assert dl.utilisation(samples, 0.0, 5.0) == {0: 50.0, 1: 100.0}


def test_sizing_formula(dl: ModuleType) -> None:
    # 2 GPUs busy 1,500 of 2 x 1,000 GPU-seconds: 75 %
    assert dl.achieved(1500.0, 1000.0, 2) == 0.75
    assert dl.achieved(10.0, 0.0, 2) == 0.0
    # GPUs = ceil(total GPU-seconds / (900 s x utilisation))
    assert dl.gpus_needed(900.0 * 0.75 * 8, 0.75) == 8
    assert dl.gpus_needed(900.0 * 0.75 * 8 + 1, 0.75) == 9
    assert dl.gpus_needed(100.0, 0.5, window_s=50.0) == 4
    with pytest.raises(ValueError):
        dl.gpus_needed(100.0, 0.0)


def test_cost_per_submission_weights_the_mix_and_fills_gaps(dl: ModuleType) -> None:
    mix = dl.Mix(0.5, 0.2, 0.3)
    cost = {
        ("a", "correct"): 60.0,
        ("a", "slow"): 150.0,
        ("a", "wrong"): 10.0,
        ("b", "correct"): 100.0,
        ("b", "wrong"): 6.0,  # no slow-correct measured on b: the median over a's is used
    }
    a = 0.5 * 60 + 0.2 * 150 + 0.3 * 10
    b = 0.5 * 100 + 0.2 * 150 + 0.3 * 6
    assert dl.cost_per_submission(cost, mix, ["a", "b"]) == pytest.approx((a + b) / 2)
    # the class: 200 x 4 x 3 gradings at that cost, at 80 % utilisation
    total = 2400 * (a + b) / 2
    assert dl.gpus_needed(total, 0.8) == math.ceil(total / 720.0)
    with pytest.raises(ValueError, match="no measured slow-correct"):
        dl.cost_per_submission({("a", "correct"): 1.0}, mix, ["a"])


def test_report_from_finished_jobs(dl: ModuleType) -> None:
    def job(i: int, kind: str, verdict: str, start: int, end: int) -> Any:
        j = dl.DeadlineJob(
            "a", f"{kind}/x", "PASS" if kind != "wrong" else "WRONG_ANSWER", "", kind=kind
        )
        j.index, j.verdict, j.seconds = i, verdict, end - start
        j.extra = {
            "created_at": "2026-12-01T10:00:00+00:00",
            "started_at": f"2026-12-01T10:0{start // 60}:{start % 60:02d}+00:00",
            "finished_at": f"2026-12-01T10:0{end // 60}:{end % 60:02d}+00:00",
        }
        return j

    jobs = [job(1, "correct", "PASS", 0, 60), job(2, "slow", "PASS", 0, 120)]
    jobs += [job(3, "wrong", "WRONG_ANSWER", 60, 70), job(4, "wrong", "PASS", 70, 80)]
    text, summary = dl.report(
        jobs,
        mix=dl.Mix(0.5, 0.2, 0.3),
        device="cuda",
        workers="gpu:0 gpu:1",
        slots=2,
        phased=False,
        pour_wall=dl.ts("2026-12-01T10:00:00+00:00"),
        submit_s=0.1,
        gpu_util={0: 80.0, 1: 70.0},
        exercises=["a"],
    )
    assert summary["drain_s"] == 120.0 and summary["slot_seconds"] == 200.0
    assert summary["utilisation_achieved"] == pytest.approx(200 / 240)
    assert "| drain time | 120 s" in text and "GPU 0 80 %, GPU 1 70 %" in text
    assert "MISSES: #4 a wrong/x PASS" in text and "as expected | 3/4" in text
    assert "Sizing: GPUs = total GPU-seconds / (900 s x utilisation achieved 83%)" in text
    assert summary["class_slots_needed"] == dl.gpus_needed(
        2400 * (0.5 * 60 + 0.2 * 120 + 0.3 * 10), 200 / 240
    )


# --- the driver, with the API faked ----------------------------------------------------------


def test_shared_gpus_pour_the_widest_first_and_write_the_json(
    dl: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from datetime import UTC, datetime

    poured: list[list[int]] = []
    clock = [datetime.now(UTC).timestamp() + 1.0]

    def submit_all(api: Any, jobs: list[Any], concurrency: int = 1) -> None:
        poured.append(sorted({j.world_size for j in jobs}))
        for j in jobs:
            j.submission_id = j.index

    def poll(api: Any, jobs: list[Any], deadline: float, on_done: Any = None) -> None:
        for j in jobs:  # one after another on one worker, 10 s each
            stamp = [datetime.fromtimestamp(clock[0] + d, UTC).isoformat() for d in (0, 0, 10)]
            j.extra = dict(zip(dl.TIMES, stamp, strict=True))
            clock[0] += 10
            j.status, j.verdict, j.seconds = "done", j.expected, 10.0
            on_done(j)

    monkeypatch.setattr(dl, "wait_ready", lambda api, timeout_s: None)
    monkeypatch.setattr(dl, "submit_all", submit_all)
    monkeypatch.setattr(dl, "poll", poll)
    monkeypatch.setattr(dl.GpuSampler, "start", lambda self: False)
    out = tmp_path / "deadline.json"
    argv = ["--token", "t", "--n", "8", "--workers", "gpu:0 gpu:1 gpu-x2:0,1", "--gpus", "2"]
    assert dl.main([*argv, "--json", str(out)]) == 0
    assert poured == [[2], [1]]  # the ring's width first, alone
    data = json.loads(out.read_text())
    assert data["config"]["phased"] and len(data["rows"]) == 8
    assert data["summary"]["finished"] == 8 and data["summary"]["slots"] == 2
    assert all(r["extra"]["timing"]["held_s"] == pytest.approx(10.0) for r in data["rows"])


def test_gpu_sampler_reads_nvidia_smi_in_the_background(
    dl: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "nvidia-smi"  # prints what `-lms 500` would, faster
    fake.write_text("#!/bin/sh\nwhile :; do echo '0, 50'; echo '1, [N/A]'; sleep 0.05; done\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    sampler = dl.GpuSampler()
    t0 = time.time()
    assert sampler.start()
    deadline = time.monotonic() + 10
    while len(sampler.samples) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    sampler.stop()
    assert sampler.proc is not None and sampler.proc.poll() is not None
    assert len(sampler.samples) >= 3 and {s[1:] for s in sampler.samples} == {(0, 50.0)}
    assert dl.utilisation(sampler.samples, t0, time.time()) == {0: 50.0}


def test_json_into_a_fifo_leaves_it_a_fifo(dl: ModuleType, tmp_path: Path) -> None:
    # write_json replaces its file by a rename; a FIFO or a device (--json /dev/null) must be
    # written into instead. A FIFO of our own stands for /dev/null: a regression here must not
    # replace the machine's /dev/null.
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    dl.write_json(fifo, [], [], {"summary": {"n": 0}})
    reader.join(timeout=10)
    assert fifo.is_fifo() and json.loads(got[0])["summary"] == {"n": 0}
