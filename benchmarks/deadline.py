"""Deadline benchmark (issue 18): N submissions poured into the queues at once, drained by the
workers that are running; how long until every verdict, and how many GPUs a class needs.

Run by ``DRIVER=deadline benchmarks/pipeline_gpu.sh --n 200`` (which starts Redis, the API and
one Celery worker per GPU, plus gpu-x2/gpu-x4 workers), or against any running kgrade:
``python benchmarks/deadline.py --api URL --token INSTRUCTOR_TOKEN --workers "gpu:0 gpu:1"``.
``--dry-run`` prints the plan (which solution each submission is) without an API.

The mix, per submission: a *correct* known solution (``solutions/correct/*``), a *slow-correct*
one, or a *wrong* one (``solutions/wrong/*`` whose ``# needs:`` this device can show: ``gpu``
cheats only on CUDA). Slow-correct is a correct known solution whose entry point runs its whole
honest computation ``--slow-repeat`` times per call on the same inputs and returns the last
result: still exactly correct (no cache, no skipped work, no threads), just that many times
slower, so it PASSes at about 1/repeat of its base's speedup (clamped at the scoring floor).
The exercises' starter files only raise NotImplementedError, so there is no plain-PyTorch form
to use instead, and a repeated correct kernel is what a slow student kernel costs the grader:
more time in the tests and in the timed loop.

Every submission's source gets a last comment line with its number, so no two are the same
file (as students' are not), and nothing could reuse one grading for another by source hash.

Times come from the server's clock (the API's ``created_at``, the worker's ``started_at`` and
``finished_at``): submit to verdict = finished - created; a grading holds its worker's GPUs
from started to finished (``held``), so its GPU-seconds are held x the GPUs it runs on.
Utilisation achieved (the sizing formula's) = the GPU-seconds of all gradings / (drain time x
GPUs): the share of the machine the queues kept busy. nvidia-smi's utilization.gpu (sampled
every 500 ms on CUDA) is printed beside it: how busy the GPUs were, the grader's own
efficiency, not the queues'. The GPU-seconds held already include the moments a held GPU idles
(a job's start, the CPU-side checks), so dividing by that utilisation too would count them
twice.

On the pipeline script's machines the multi-GPU workers share GPUs with the one-GPU workers
(gpu-x2 on GPUs 0,1), and a worker's health gate refuses a GPU that another job is using (it
stops consuming its queue). There the pour goes one width at a time, the widest first, each
width all at once (as pipeline_gpu.py does); latency is then also given from the pour, the
moment every student submitted. With disjoint GPUs per worker everything is poured at once.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipeline_gpu import Api, Job, poll, submit_all, wait_ready, write_json  # noqa: E402

from workers.exercises import load_exercise  # noqa: E402
from workers.harness.parent import REHEARSAL_ENV  # noqa: E402

KINDS = ("correct", "slow", "wrong")
KIND_LABEL = {"correct": "correct", "slow": "slow-correct", "wrong": "wrong"}
ONE_GPU_EXERCISES = ("attention-merge", "block-attention", "nsa-attention")
#: The sizing question of issue 18: a class of 200 students, four exercises, three submissions
#: each, every verdict within 15 minutes.
CLASS_STUDENTS, CLASS_EXERCISES, CLASS_SUBMISSIONS, WINDOW_S = 200, 4, 3, 900.0

SLOW_WRAPPER = """

# --- deadline benchmark: slow-correct. The honest computation above, done {repeat} times per
# call on the same inputs (the same, correct, result): correct and {repeat}x slower.
_deadline_fast_{entry} = {entry}


def {entry}(*args, **kwargs):
    result = None
    for _ in range({repeat}):
        result = _deadline_fast_{entry}(*args, **kwargs)
    return result
"""


# --- the mix ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mix:
    correct: float
    slow: float
    wrong: float

    @classmethod
    def parse(cls, text: str) -> Mix:
        """``"0.5,0.2,0.3"``: fractions correct, slow-correct, wrong; they must sum to 1."""
        parts = [float(x) for x in text.split(",")]
        if len(parts) != 3 or any(p < 0 for p in parts) or abs(sum(parts) - 1.0) > 1e-6:
            raise ValueError(f"--mix needs three non-negative fractions summing to 1: {text!r}")
        return cls(*parts)

    def fraction(self, kind: str) -> float:
        return float(getattr(self, kind))

    def counts(self, n: int) -> dict[str, int]:
        """Submissions per kind for N, by largest remainder: they sum to N exactly and each is
        within one of its share (ties go to the kind listed first)."""
        shares = {k: n * self.fraction(k) for k in KINDS}
        counts = {k: math.floor(s) for k, s in shares.items()}
        left = n - sum(counts.values())
        for k in sorted(KINDS, key=lambda k: (-(shares[k] - counts[k]), KINDS.index(k)))[:left]:
            counts[k] += 1
        return counts

    def __str__(self) -> str:
        return " / ".join(f"{KIND_LABEL[k]} {self.fraction(k):.2f}" for k in KINDS)


@dataclass(frozen=True)
class Pick:
    exercise: str
    kind: str  # one of KINDS
    solution: str  # a known solution's name, "correct/stable_fp32" (slow: its base's name)


def shown_on(needs: str | None, device: str, rehearsal: bool) -> bool:
    """Whether a known solution's expected verdict shows here: ``# needs: gpu`` cheats only on
    CUDA; ``benchmark`` ones where the timed loop runs (CUDA, or a CPU worker started with
    KGRADE_BENCH_REHEARSAL=1: without it a CPU grading has no benchmark phase, and they PASS)."""
    if needs == "gpu":
        return device == "cuda"
    if needs == "benchmark":
        return device == "cuda" or rehearsal
    return True


def pools(
    exercises: Iterable[str], device: str, rehearsal: bool
) -> dict[tuple[str, str], list[str]]:
    """Known solutions per (exercise, kind): slow-correct is built from the correct ones."""
    out: dict[tuple[str, str], list[str]] = {}
    for eid in exercises:
        sols = load_exercise(eid).solutions()
        correct = [s.name for s in sols if s.path.parent.name == "correct"]
        out[eid, "correct"] = correct
        out[eid, "slow"] = list(correct)
        out[eid, "wrong"] = [
            s.name
            for s in sols
            if s.path.parent.name == "wrong" and shown_on(s.needs, device, rehearsal)
        ]
    return out


def plan(
    n: int,
    mix: Mix,
    exercises: Sequence[str],
    pool: dict[tuple[str, str], list[str]],
    seed: int,
) -> list[Pick]:
    """N submissions: the mix's count of each kind, spread over the exercises as evenly as their
    pools allow (each to the exercise with the fewest of that kind, then the fewest in all, so
    every exercise gets every kind before any gets two), a solution drawn at random from its
    pool; in random order, as a deadline's arrivals. Same arguments, same plan."""
    rng = random.Random(seed)
    total = dict.fromkeys(exercises, 0)
    picks: list[Pick] = []
    for kind, count in mix.counts(n).items():
        of_kind = dict.fromkeys(exercises, 0)
        for _ in range(count):
            able = [e for e in exercises if pool.get((e, kind))]
            if not able:
                raise ValueError(f"no {KIND_LABEL[kind]} solution in {', '.join(exercises)}")
            fewest = min((of_kind[e], total[e]) for e in able)
            eid = rng.choice([e for e in able if (of_kind[e], total[e]) == fewest])
            of_kind[eid] += 1
            total[eid] += 1
            picks.append(Pick(eid, kind, rng.choice(pool[eid, kind])))
    rng.shuffle(picks)
    return picks


def slow_source(source: str, entry: str, repeat: int) -> str:
    """A correct solution whose entry does its whole computation ``repeat`` times per call."""
    return source + SLOW_WRAPPER.format(entry=entry, repeat=repeat)


@dataclass
class DeadlineJob(Job):
    kind: str = "correct"
    index: int = 0


def make_jobs(picks: Sequence[Pick], slow_repeat: int) -> list[DeadlineJob]:
    jobs = []
    for i, p in enumerate(picks):
        ex = load_exercise(p.exercise)
        sol = next(s for s in ex.solutions() if s.name == p.solution)
        source = sol.source()
        name, expected = p.solution, sol.expected.value
        if p.kind == "slow":
            source = slow_source(source, ex.entry, slow_repeat)
            name = f"slow/{p.solution.split('/', 1)[1]}x{slow_repeat}"
        source += f"\n# deadline benchmark: submission {i + 1} of {len(picks)}\n"
        jobs.append(
            DeadlineJob(p.exercise, name, expected, source, ex.world_size, kind=p.kind, index=i + 1)
        )
    return jobs


# --- workers ---------------------------------------------------------------------------------


def parse_workers(text: str) -> list[tuple[str, tuple[int, ...]]]:
    """``"gpu:0 gpu:1 gpu-x2:0,1"`` (pipeline_gpu.sh's list): (queue, GPU indices) each."""
    out = []
    for item in text.split():
        queue, _, gpus = item.partition(":")
        out.append((queue, tuple(int(g) for g in gpus.split(",") if g)))
    return out


def shared_gpus(workers: Sequence[tuple[str, tuple[int, ...]]]) -> bool:
    """True when workers of different queues hold a GPU in common: a job of one would then
    trip the other's health gate, so only one width may be in the queues at a time."""
    return any(
        qa != qb and set(ga) & set(gb)
        for i, (qa, ga) in enumerate(workers)
        for qb, gb in workers[i + 1 :]
    )


def slot_count(workers: Sequence[tuple[str, tuple[int, ...]]], device: str, gpus: int) -> int:
    """The machine's capacity: GPUs on CUDA; on CPU each worker (``-c 1``) is one slot."""
    if device == "cuda":
        return len({g for _, gs in workers for g in gs}) or gpus
    return max(1, len(workers))


def default_exercises(workers: Sequence[tuple[str, tuple[int, ...]]]) -> list[str]:
    extra = ["ring-attention"] if any(q == "gpu-x2" for q, _ in workers) else []
    return [*ONE_GPU_EXERCISES, *extra]


# --- statistics ------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the closest ranks (numpy's default)."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ts(text: str | None) -> float | None:
    """An API timestamp (ISO 8601 with offset) as Unix seconds."""
    return datetime.fromisoformat(text).timestamp() if text else None


#: The server's stamps a finished submission carries (pipeline_gpu.poll keeps them in extra).
TIMES = ("created_at", "started_at", "finished_at")


@dataclass
class Timing:
    """One finished submission's times, in seconds, from the server's clock."""

    latency_s: float  # accepted -> verdict
    queued_s: float  # accepted -> a worker started it
    held_s: float  # started -> verdict: its worker's GPUs were busy with it
    from_pour_s: float  # the pour (every student submitting) -> verdict
    slot_s: float  # held x the GPUs it ran on (the worker slot on CPU)


def timing(job: Job, pour_wall: float, device: str) -> Timing | None:
    created, started, finished = (ts(job.extra.get(k)) for k in TIMES)
    if created is None or started is None or finished is None:
        return None
    held = finished - started
    return Timing(
        latency_s=finished - created,
        queued_s=started - created,
        held_s=held,
        from_pour_s=finished - pour_wall,
        slot_s=held * (job.world_size if device == "cuda" else 1),
    )


def utilisation(
    samples: Iterable[tuple[float, int, float]], t_from: float, t_to: float
) -> dict[int, float]:
    """Mean nvidia-smi utilization.gpu (%) per GPU over the samples taken in [t_from, t_to]."""
    per: dict[int, list[float]] = {}
    for t, gpu, util in samples:
        if t_from <= t <= t_to:
            per.setdefault(gpu, []).append(util)
    return {g: statistics.fmean(v) for g, v in sorted(per.items())}


def parse_smi_line(line: str) -> tuple[int, float] | None:
    """``"0, 37"`` -> (0, 37.0); None for what is not a sample (``[N/A]``, blank lines)."""
    idx, _, util = line.partition(",")
    try:
        return int(idx.strip()), float(util.strip())
    except ValueError:
        return None


def achieved(slot_seconds: float, drain_s: float, slots: int) -> float:
    """Utilisation achieved: the share of the machine's slot-seconds gradings held."""
    return slot_seconds / (drain_s * slots) if drain_s > 0 and slots > 0 else 0.0


def gpus_needed(total_gpu_s: float, util: float, window_s: float = WINDOW_S) -> int:
    """GPUs to drain ``total_gpu_s`` of gradings within ``window_s`` at that utilisation:
    ceil(total GPU-seconds / (window x utilisation))."""
    if util <= 0 or window_s <= 0:
        raise ValueError("utilisation and window must be positive")
    return math.ceil(total_gpu_s / (window_s * util))


def cost_per_submission(
    cost: dict[tuple[str, str], float], mix: Mix, exercises: Sequence[str]
) -> float:
    """Expected GPU-seconds of one submission: the mix's weighted median cost per exercise,
    averaged over the exercises (an exercise without a measured kind takes that kind's
    median over the exercises that have it)."""
    by_kind = {
        k: statistics.median(v)
        for k in KINDS
        if (v := [c for (_, kk), c in cost.items() if kk == k])
    }
    per_exercise = []
    for eid in exercises:
        total = 0.0
        for k in KINDS:
            f = mix.fraction(k)
            if f == 0:
                continue
            c = cost.get((eid, k), by_kind.get(k))
            if c is None:
                raise ValueError(f"no measured {KIND_LABEL[k]} grading to size with")
            total += f * c
        per_exercise.append(total)
    return statistics.fmean(per_exercise)


# --- nvidia-smi in the background --------------------------------------------------------------


class GpuSampler:
    """``nvidia-smi ... -lms 500`` read by a thread that stamps each line on arrival."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, float]] = []
        self.proc: subprocess.Popen[str] | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> bool:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return False
        cmd = [exe, "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits"]
        self.proc = subprocess.Popen(
            [*cmd, "-lms", "500"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return True

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            s = parse_smi_line(line)
            if s is not None:
                self.samples.append((time.time(), *s))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.thread is not None:
            self.thread.join(timeout=5)


# --- the report ------------------------------------------------------------------------------


def units(n: int, unit: str) -> str:
    return f"{n} {unit}" + ("" if n == 1 else "s")


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def report(
    jobs: Sequence[DeadlineJob],
    *,
    mix: Mix,
    device: str,
    workers: str,
    slots: int,
    phased: bool,
    pour_wall: float,
    submit_s: float,
    gpu_util: dict[int, float] | None,
    exercises: Sequence[str],
) -> tuple[str, dict[str, Any]]:
    """The markdown table, the sizing lines and the summary for the JSON."""
    unit = "GPU" if device == "cuda" else "worker"
    times = {j.index: t for j in jobs if (t := timing(j, pour_wall, device)) is not None}
    done = [j for j in jobs if j.index in times]
    tms = list(times.values())
    counts = Counter(j.kind for j in jobs)
    rows: list[tuple[str, str]] = [
        ("N", f"{len(jobs)} ({', '.join(exercises)})"),
        (
            "mix",
            f"{mix} -> " + " / ".join(f"{counts[k]} {KIND_LABEL[k]}" for k in KINDS),
        ),
        (
            "workers",
            f"{workers} (device {device}; {units(slots, unit)}; "
            + ("one width at a time, widest first" if phased else "everything at once")
            + ")",
        ),
    ]
    summary: dict[str, Any] = {"finished": len(done), "n": len(jobs), "slots": slots}
    if not tms:
        rows.append(("verdicts", "none arrived"))
        return _markdown(rows), summary
    drain = max(t.from_pour_s for t in tms)
    lat = [t.latency_s for t in tms]
    pour = [t.from_pour_s for t in tms]
    slot_total = sum(t.slot_s for t in tms)
    util = achieved(slot_total, drain, slots)
    unfinished = len(jobs) - len(done)
    rows.append(
        (
            "drain time",
            f"{drain:.0f} s, the pour to the last verdict (submitting all: {submit_s:.1f} s)"
            + (f"; {unfinished} without a verdict at the deadline" if unfinished else ""),
        )
    )
    rows.append(
        (
            "submit -> verdict p50 / p95 / max",
            f"{percentile(lat, 50):.0f} / {percentile(lat, 95):.0f} / {max(lat):.0f} s",
        )
    )
    if phased:
        rows.append(
            (
                "pour -> verdict p50 / p95 / max",
                f"{percentile(pour, 50):.0f} / {percentile(pour, 95):.0f} / {max(pour):.0f} s "
                "(a narrower width is submitted once the wider one has drained)",
            )
        )
    rows.append(
        (
            "queued (accepted -> started) p50 / max",
            f"{percentile([t.queued_s for t in tms], 50):.0f} / "
            f"{max(t.queued_s for t in tms):.0f} s",
        )
    )
    for k in KINDS:
        vs = Counter(j.verdict for j in done if j.kind == k)
        if vs:
            rows.append(
                (f"verdicts, {KIND_LABEL[k]}", ", ".join(f"{v} {c}" for v, c in vs.most_common()))
            )
    exact = sum(j.verdict == j.expected for j in done)
    misses = [j for j in done if not j.ok]
    rows.append(
        (
            "as expected",
            f"{len(done) - len(misses)}/{len(done)} (exact expected verdict {exact}/{len(done)})"
            + (
                "; MISSES: "
                + ", ".join(f"#{j.index} {j.exercise} {j.name} {j.verdict}" for j in misses)
                if misses
                else ""
            ),
        )
    )
    # GPU-seconds per grading by exercise, kind and verdict (median), with the harness's own
    # elapsed time (confirmation run included) and the first run's phases beside it.
    groups: dict[tuple[str, str, str], list[DeadlineJob]] = {}
    for j in done:
        groups.setdefault((j.exercise, j.kind, str(j.verdict)), []).append(j)
    cost_samples: dict[tuple[str, str], list[float]] = {}
    for (eid, kind, verdict), js in sorted(groups.items()):
        slot_s = [times[j.index].slot_s for j in js]
        cost_samples.setdefault((eid, kind), []).extend(slot_s)
        el = [j.seconds for j in js if j.seconds is not None]
        sp = [j.speedup for j in js if j.speedup is not None]
        phs = [j.extra["phase_s"] for j in js if j.extra.get("phase_s")]
        names = [n for n in ("import", "tests", "benchmark") if any(n in p for p in phs)]
        phases = " / ".join(
            f"{n} {statistics.median(p[n] for p in phs if n in p):.1f}" for n in names
        )
        rows.append(
            (
                f"{unit}-s per grading, {eid} {KIND_LABEL[kind]} {verdict}",
                f"{statistics.median(slot_s):.1f} (n={len(js)}, {min(slot_s):.1f}-"
                f"{max(slot_s):.1f}; harness {fmt_s(statistics.median(el) if el else None)} s"
                + (f"; phases {phases} s" if phases else "")
                + (f"; speedup {statistics.median(sp):.3f}x" if sp else "")
                + ")",
            )
        )
    if gpu_util is None:
        rows.append(("mean GPU utilisation (nvidia-smi)", "not sampled (no GPU: CPU run)"))
    else:
        rows.append(
            (
                "mean GPU utilisation (nvidia-smi, over the drain)",
                ", ".join(f"GPU {g} {u:.0f} %" for g, u in gpu_util.items()) or "no samples",
            )
        )
    rows.append(
        (
            "utilisation achieved",
            f"{util:.0%} = {slot_total:.0f} {unit}-s held by gradings / ({drain:.0f} s x "
            f"{units(slots, unit)})",
        )
    )
    cost = {k: statistics.median(v) for k, v in cost_samples.items()}
    per_sub = cost_per_submission(cost, mix, sorted({e for e, _ in cost}))
    klass = CLASS_STUDENTS * CLASS_EXERCISES * CLASS_SUBMISSIONS
    class_total = klass * per_sub
    longest = max(t.held_s for t in tms)
    lines = [
        _markdown(rows),
        "",
        f"Sizing: {unit}s = total {unit}-seconds / ({WINDOW_S:.0f} s x utilisation achieved "
        f"{util:.0%}).",
        f"- {CLASS_STUDENTS} students x {CLASS_EXERCISES} exercises x {CLASS_SUBMISSIONS} "
        f"submissions = {klass} gradings x {per_sub:.1f} {unit}-s (this mix's expected cost "
        f"of one, mean over {', '.join(sorted({e for e, _ in cost}))}) = {class_total:.0f} "
        f"{unit}-s -> **{units(gpus_needed(class_total, util), unit)}** to return every verdict "
        f"within 15 minutes.",
        f"- The {len(done)} measured here: {slot_total:.0f} {unit}-s -> "
        f"{units(gpus_needed(slot_total, util), unit)} for 15 minutes (this run: {slots} in "
        f"{drain:.0f} s).",
        f"- With the tail (the last grading starts at most its own length before the end: "
        f"window {WINDOW_S:.0f} - {longest:.0f} s): "
        + (
            f"{units(gpus_needed(class_total, util, WINDOW_S - longest), unit)} for the class"
            if longest < WINDOW_S
            else "one grading alone takes longer than 15 minutes"
        )
        + ".",
    ]
    if device != "cuda":
        lines.append(
            "- CPU rehearsal: these are worker-seconds of CPU gradings (tiny shapes), so the "
            "numbers only prove the arithmetic; the GPU run gives the answer."
        )
    summary.update(
        drain_s=drain,
        submit_s=submit_s,
        latency_p50_s=percentile(lat, 50),
        latency_p95_s=percentile(lat, 95),
        latency_max_s=max(lat),
        from_pour_p50_s=percentile(pour, 50),
        from_pour_p95_s=percentile(pour, 95),
        slot_seconds=slot_total,
        utilisation_achieved=util,
        gpu_utilisation=gpu_util,
        cost_per_grading={f"{e} {k}": c for (e, k), c in cost.items()},
        cost_per_submission=per_sub,
        class_gradings=klass,
        class_slot_seconds=class_total,
        class_slots_needed=gpus_needed(class_total, util),
        measured_slots_needed=gpus_needed(slot_total, util),
        unit=unit,
    )
    return "\n".join(lines), summary


def _markdown(rows: Sequence[tuple[str, str]]) -> str:
    out = ["| what | result |", "|---|---|"]
    out += [f"| {a} | {b.replace('|', '/')} |" for a, b in rows]
    return "\n".join(out)


# --- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--api", default="http://127.0.0.1:8000")
    ap.add_argument("--token", help="an instructor token (not needed with --dry-run)")
    ap.add_argument("--n", type=int, default=200, help="submissions to pour in")
    ap.add_argument(
        "--mix",
        type=Mix.parse,
        default=Mix(0.5, 0.2, 0.3),
        help="fractions correct,slow-correct,wrong (default 0.5,0.2,0.3)",
    )
    ap.add_argument(
        "--exercise",
        action="append",
        help="draw from these (repeatable); default: attention-merge, block-attention, "
        "nsa-attention, and ring-attention where a gpu-x2 worker runs",
    )
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument(
        "--slow-repeat", type=int, default=3, help="times a slow-correct entry recomputes"
    )
    ap.add_argument("--concurrency", type=int, default=8, help="submissions in flight at once")
    ap.add_argument(
        "--workers",
        default="gpu:0",
        help='the running workers as "queue:GPUs ..." (pipeline_gpu.sh passes its list)',
    )
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--gpus", type=int, default=1, help="exercises needing more are skipped")
    ap.add_argument(
        "--deadline",
        type=float,
        default=7200.0,
        help="seconds to wait for every verdict; what has none then is reported unfinished",
    )
    ap.add_argument("--json", type=Path, help="write every submission's data here")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, submit nothing")
    args = ap.parse_args(argv)
    if args.n < 1 or args.slow_repeat < 2 or args.concurrency < 1:
        ap.error("--n and --concurrency must be at least 1, --slow-repeat at least 2")
    if not args.dry_run and not args.token:
        ap.error("--token is required (or --dry-run)")

    workers = parse_workers(args.workers)
    wanted = args.exercise or default_exercises(workers)
    exercises, skipped = [], []
    for eid in wanted:
        ws = load_exercise(eid).world_size
        if ws > args.gpus:
            skipped.append(f"{eid} (needs {ws} GPUs, {args.gpus} here)")
        else:
            exercises.append(eid)
    if not exercises:
        ap.error("no exercise fits: " + "; ".join(skipped))
    # The CPU worker inherits this environment from pipeline_gpu.sh, so it is the worker's too.
    rehearsal = args.device == "cpu" and os.environ.get(REHEARSAL_ENV) == "1"
    if args.device == "cpu" and not rehearsal:
        print(
            f"CPU without {REHEARSAL_ENV}=1: no benchmark phase, so no speedups, slow-correct "
            "costs what correct does, and the timing cheats are left out",
            flush=True,
        )
    picks = plan(args.n, args.mix, exercises, pools(exercises, args.device, rehearsal), args.seed)
    jobs = make_jobs(picks, args.slow_repeat)
    widths = sorted({j.world_size for j in jobs}, reverse=True)
    phased = shared_gpus(workers) and len(widths) > 1
    slots = slot_count(workers, args.device, args.gpus)
    print(
        f"deadline: {len(jobs)} submissions of {', '.join(exercises)} ({args.mix}; seed "
        f"{args.seed}); workers {args.workers}; skipped: {', '.join(skipped) or 'none'}",
        flush=True,
    )
    if args.dry_run:
        for j in jobs:
            print(f"  #{j.index:<4} {j.exercise:<18} {KIND_LABEL[j.kind]:<13} {j.name}")
        return 0

    api = Api(args.api, args.token)
    wait_ready(api, 120)
    config = {
        "n": args.n,
        "mix": vars(args.mix),
        "exercises": exercises,
        "skipped": skipped,
        "seed": args.seed,
        "slow_repeat": args.slow_repeat,
        "workers": args.workers,
        "device": args.device,
        "phased": phased,
    }
    sampler = GpuSampler()
    sampling = args.device == "cuda" and sampler.start()
    if args.device == "cuda" and not sampling:
        print("nvidia-smi not found: GPU utilisation not sampled", flush=True)
    t0 = time.monotonic()
    pour_wall = time.time()  # the server stamps times with the same host clock
    submit_s = 0.0

    def done(job: Job) -> None:
        sp = f"{job.speedup:.3f}" if job.speedup is not None else "-"
        print(
            f"[done {time.monotonic() - t0:5.0f} s] #{getattr(job, 'index', 0)} {job.exercise} "
            f"{job.name}: {job.verdict} speedup {sp} in {job.seconds} s",
            flush=True,
        )
        if args.json:
            write_json(args.json, jobs, skipped, {"config": config, "pour_wall": pour_wall})

    try:
        for width in widths if phased else [None]:
            phase = [j for j in jobs if width is None or j.world_size == width]
            if time.monotonic() > t0 + args.deadline:
                # Never queue a width behind unfinished gradings of another: their processes
                # would trip the next workers' health gates (as in pipeline_gpu.py).
                for j in phase:
                    j.status = "not submitted (deadline)"
                continue
            t_sub = time.monotonic()
            submit_all(api, phase, concurrency=args.concurrency)
            submit_s += time.monotonic() - t_sub
            print(
                f"== poured {sum(j.submission_id is not None for j in phase)}/{len(phase)}"
                + (f" needing {width} GPU(s)" if width else "")
                + f" in {time.monotonic() - t_sub:.1f} s",
                flush=True,
            )
            poll(api, phase, t0 + args.deadline, done)
    finally:
        sampler.stop()
    for j in jobs:  # the derived times beside the server's stamps, for the JSON
        if (t := timing(j, pour_wall, args.device)) is not None:
            j.extra["timing"] = vars(t)
    t_end = max((ts(j.extra.get("finished_at")) or 0.0 for j in jobs), default=time.time())
    gpu_util = utilisation(sampler.samples, pour_wall, t_end) if sampling else None
    text, summary = report(
        jobs,
        mix=args.mix,
        device=args.device,
        workers=args.workers,
        slots=slots,
        phased=phased,
        pour_wall=pour_wall,
        submit_s=submit_s,
        gpu_util=gpu_util,
        exercises=exercises,
    )
    print(text, flush=True)
    if args.json:
        write_json(
            args.json,
            jobs,
            skipped,
            {
                "config": config,
                "pour_wall": pour_wall,
                "summary": summary,
                "gpu_samples": sampler.samples,
            },
        )
    finished = all(j.verdict is not None for j in jobs)
    return 0 if finished and all(j.ok for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
