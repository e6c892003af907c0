"""The grading parent: one fresh process tree per job (grader spec §2).

``grade()`` is what the Celery task (and the CLI) calls: one job (``job.py``) through its phases
(import and tests: ``phases.py``; benchmark: ``bench.py``) to a scored result (``scoring.py``).
It never imports student code and never touches CUDA itself: it starts a trusted checker
process and a sandboxed runner, passes messages between them over channels it created
(``channel.py``), validates every runner message against what it asked for, enforces per-phase
wall-clock budgets by killing the sandbox's whole process group, and computes timing statistics
from raw samples. Default verdict: failure. ``grade_ranked()`` adds the confirmation run.
"""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import subprocess
import threading
import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

from workers.exercises import load_exercise
from workers.harness import roofline
from workers.harness.bench import run_benchmark, start_ahead
from workers.harness.failure import Failure
from workers.harness.job import Job, ProgressFn, _secret, harness_hash, job_gpus
from workers.harness.phases import import_submission, run_tests
from workers.harness.scoring import confirm, retime, score
from workers.results import GradeResult, TestResult, cap_text
from workers.verdicts import Verdict

#: CI only: run the benchmark loop on CPU over each spec's tiny ``rehearsal_benchmark`` shapes,
#: timed by the wall clock. Exercises every step of the GPU path (multi-rank included) where CI
#: has no GPU; such speedups mean nothing and are marked ``details["rehearsal"]``.
REHEARSAL_ENV = "KGRADE_BENCH_REHEARSAL"


def _versions() -> dict[str, Any]:
    v: dict[str, Any] = {"python": platform.python_version()}
    try:
        from importlib.metadata import version

        for p in ("torch", "triton"):
            try:
                v[p] = version(p)
            except Exception:  # noqa: BLE001
                v[p] = None
    except ImportError:
        pass
    return v


def _hardware(device: str, world: int = 1) -> dict[str, Any]:
    hw: dict[str, Any] = {
        "host_cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }
    if device == "cuda":
        # nvidia-smi, not torch: the parent must not create a CUDA context.
        try:
            out = (
                subprocess.run(
                    [
                        "nvidia-smi",
                        "-i",
                        ",".join(map(str, job_gpus(world)[0])),  # the job's GPUs only
                        "--query-gpu=name,driver_version,memory.total,"
                        "clocks.sm,clocks.mem,temperature.gpu,clocks_throttle_reasons.active",
                        "--format=csv,noheader",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
                .stdout.strip()
                .splitlines()
            )
            hw["gpus"] = out
        except (OSError, subprocess.SubprocessError):
            hw["gpus"] = []
    return hw


def grade(
    exercise_id: str,
    source: str | bytes,
    *,
    device: str = "cpu",
    secret: bytes | None = None,
    isolation: str | None = None,
    only_public: bool = False,
    trusted: bool = False,
    reference_timing: bool = True,
    timed: bool = True,
    limits: dict[str, float] | None = None,
    progress: ProgressFn | None = None,
    rehearsal: bool | None = None,
    on_job: Callable[[Job], None] | None = None,
    before_benchmark: Callable[[], bool] | None = None,
) -> GradeResult:
    """Grade one submission of ``exercise_id`` in a fresh process tree; never raises for
    anything the submission does (its verdict says it), INFRA_ERROR for our own faults.

    ``timed=False`` skips the benchmark phase (a confirmation run that only has to pass).
    ``progress(phase, done, total)``, if given, is called at each phase start, after each test
    case and after each benchmark shape (see ``ProgressFn``); its exceptions are ignored.
    ``on_job(job)`` is called with the job before any of its processes starts (so that another
    thread can kill them: ``Job.kill``). ``before_benchmark()`` is called once the tests have
    passed, before the benchmark: it may wait (the time shows as ``phase_s["wait"]``), and the
    benchmark is skipped when it returns False."""
    t0 = time.monotonic()
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    ex = load_exercise(exercise_id)
    if limits:  # per-phase wall-clock overrides (tests; staff re-runs)
        ex.limits.update({k: float(v) for k, v in limits.items()})
    src = source.encode() if isinstance(source, str) else bytes(source)
    run_id = secrets.token_hex(8)
    world = ex.world_size
    if rehearsal is None:
        rehearsal = os.environ.get(REHEARSAL_ENV) == "1"
    rehearsal = device == "cpu" and rehearsal
    if device == "cuda" and world > 1:
        world = int(os.environ.get("KGRADE_WORLD", world))
    job = Job(
        ex,
        src,
        device,
        _secret(secret),
        trusted=trusted,
        isolation=isolation,
        only_public=only_public,
        world=world,
        progress=progress,
    )
    if on_job is not None:
        on_job(job)
    res = GradeResult(
        exercise=exercise_id,
        verdict=Verdict.INFRA_ERROR,
        score=0.0,
        device=device,
        run_id=run_id,
        harness_hash=harness_hash(),
        versions=_versions(),
        hardware=_hardware(device, world),
    )
    tests: list[TestResult] = []
    plan: dict[str, Any] = {}
    try:
        # the import phase covers the job's start-up too (runner and checker start in parallel)
        job.report("import", 0, 1)
        job.setup()
        job.start_checker()
        job.start_runner()  # starts while the checker imports torch and draws the cases
        res.isolation = (job.isolation or "none") + ("+seccomp" if job.seccomp else "")
        plan = job.checker.ask(
            {
                "op": "init",
                "exercise": exercise_id,
                "secret": job.secret.hex(),
                "nonce": run_id,
                "device": device,
                "job": str(job.root),
                "world": world,
                "only_public": only_public,
                # our reference may use fused PyTorch attention (cuDNN blocks in the ring)
                "trusted": trusted,
                "rehearsal": rehearsal,
            }
        )
        import_submission(job)
        bench = timed and (device == "cuda" or rehearsal) and plan.get("bench") and not only_public
        if bench:  # the benchmark's fresh runners start up while the tests run
            start_ahead(job, reference_timing)
        tests_cost: dict[str, float] = {}
        res.details["tests_s"] = tests_cost  # where the phase waited, for operators
        run_tests(job, plan, tests, tests_cost)
        verdict = Verdict.PASS
        message = f"all {len(tests)} tests passed"
        if bench and before_benchmark is not None:
            job.marks["wait"] = time.monotonic()
            bench = before_benchmark()
        if bench:
            run_benchmark(job, plan, res, reference_timing, grade)
            if rehearsal:
                res.details["rehearsal"] = True
            if res.speedup is not None:
                message += f"; speedup (geomean, clamped) {res.speedup:.3f}x"
            if res.roofline:  # GPU runs only: a CPU rehearsal has no roofline
                message += "; " + roofline.summary_text(res.roofline)
        res.verdict = verdict
        res.output = message
    except Failure as f:
        res.verdict = f.verdict
        res.output = cap_text(f"{f.verdict.value}: {f.message}")
    except Exception as e:  # noqa: BLE001 - our bug: not charged to the student
        res.verdict = Verdict.INFRA_ERROR
        res.output = f"INFRA_ERROR: {type(e).__name__}: {e}"
    finally:
        job.marks["close"] = time.monotonic()  # its own line in phase_s: not the last phase's
        try:
            job.close()
        except Exception as e:  # noqa: BLE001
            res.details["cleanup_error"] = repr(e)
    job.report("done", 1, 1)
    # seconds per phase reached (import covers the job's start-up), for operators
    seq = sorted(job.marks.items(), key=lambda kv: kv[1])
    res.details["phase_s"] = {a: round(tb - ta, 3) for (a, ta), (_, tb) in pairwise(seq)}
    res.logs = "\n".join(x for x in (job.prior_logs, job.logs) if x)
    # tests that never ran are reported as failed, so the list always covers every case
    names = {t.name for t in tests}
    for c in plan.get("cases", []):
        if c["name"] not in names:
            tests.append(
                TestResult(c["name"], 0.0, False, "not run", c["visibility"], res.verdict.value)
            )
    score(ex, res, tests)
    res.tests = tests
    res.elapsed_s = time.monotonic() - t0
    return res


#: The confirmation run's import and tests run beside the first run's import and tests, each in
#: its own process tree, and end before the first run's benchmark starts (nothing of them runs
#: while anything is timed). ``KGRADE_CONFIRM_CONCURRENT=0``: the confirmation runs after the
#: first run, as before.
CONCURRENT_CONFIRM_ENV = "KGRADE_CONFIRM_CONCURRENT"
#: Verdicts a confirmation beside the first run could owe to it (two copies of the submission
#: on one GPU and its host: memory, time) or to us: such a confirmation is not taken, and the
#: confirmation runs again after the first run, on its own.
NOT_TAKEN_BESIDE = frozenset({Verdict.RESOURCE_LIMIT, Verdict.TIMEOUT, Verdict.INFRA_ERROR})


def _memory_failure(r: GradeResult) -> bool:
    """A first run that ran out of memory while the confirmation ran beside it: graded again on
    its own (the confirmation's copy of the submission held memory too)."""
    return r.verdict is Verdict.RESOURCE_LIMIT and "memory" in r.output.lower()


def _may_confirm(ex: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``grade(**kwargs)`` can pass with a speedup (the only results confirmed), on one
    GPU (a ring's two jobs at once would hold the same GPUs' memory, and its per-rank memory
    bounds would see each other)."""
    if kwargs.get("trusted") or kwargs.get("only_public") or not kwargs.get("timed", True):
        return False
    if ex.world_size != 1:
        return False
    device = kwargs.get("device", "cpu")
    rehearsal = kwargs.get("rehearsal")
    if rehearsal is None:
        rehearsal = os.environ.get(REHEARSAL_ENV) == "1"
    shapes = ex.benchmark if device == "cuda" else (ex.rehearsal if rehearsal else None)
    return bool(shapes) and kwargs.get("reference_timing", True)


class _Beside(threading.Thread):
    """A confirmation run's untimed part (import and tests, another secret), graded in this
    thread beside the first run. Its progress events are kept and passed on only after the
    first run's, so the caller sees the phases in their usual order."""

    def __init__(self, exercise_id: str, source: str | bytes, kwargs: dict[str, Any]) -> None:
        super().__init__(name="kgrade-confirmation", daemon=True)
        self.args = (exercise_id, source)
        self.kwargs = {**kwargs, "secret": secrets.token_bytes(32), "timed": False}
        self.events: list[tuple[str, int, int]] = []
        self.jobs: list[Job] = []
        self.lock = threading.Lock()
        self.cancelled = False
        self.result: GradeResult | None = None

    def run(self) -> None:
        try:
            self.result = grade(
                *self.args,
                progress=lambda phase, done, total: self.events.append((phase, done, total)),
                on_job=self._on_job,
                **self.kwargs,
            )
        except Exception:  # noqa: BLE001 - our bug: the confirmation then runs after the first
            self.result = None

    def _on_job(self, job: Job) -> None:
        with self.lock:
            self.jobs.append(job)
            if self.cancelled:
                job.kill()

    def cancel(self) -> None:
        """Stop it now (the first run failed: no confirmation is needed)."""
        with self.lock:
            self.cancelled = True
            for job in self.jobs:
                job.kill()
        self.join()

    def usable(self) -> GradeResult | None:
        """Its result, once ended, unless it may owe its verdict to the run beside it."""
        self.join()
        r = self.result
        if r is None or self.cancelled or (not r.passed and r.verdict in NOT_TAKEN_BESIDE):
            return None
        return r


def grade_ranked(
    exercise_id: str,
    source: str | bytes,
    *,
    progress: ProgressFn | None = None,
    **kwargs: Any,
) -> GradeResult:
    """``grade()``, plus a confirmation run when the result would be ranked (grader spec §6).

    A student submission that passes with a speedup is graded once more with another secret
    (new hidden cases, seeds and probes) before its score counts; see ``confirm``. Its benchmark
    runs only where a second timing could change the result (``retime``). Trusted reference
    runs are never ranked and run once. Progress: the first run's phases, then
    ``confirm-import``, ``confirm-tests``, ``confirm-benchmark`` (when timed), and one ``done``
    at the end.

    Where the first run can pass with a speedup, the confirmation's import and tests run beside
    the first run's import and tests (``_Beside``, its own process tree and secret), and the
    first run's benchmark starts only once they have ended: nothing of the confirmation runs
    while anything is timed. A first run that fails stops it. A confirmation that is timed again
    (``retime``) runs whole after the first run, as before, with yet another secret.
    """

    def relay(prefix: str) -> ProgressFn:
        def report(phase: str, done: int, total: int) -> None:
            if progress is not None and phase != "done":
                progress(prefix + phase, done, total)

        return report

    t0 = time.monotonic()
    ex = load_exercise(exercise_id)
    beside: _Beside | None = None
    if os.environ.get(CONCURRENT_CONFIRM_ENV, "1") != "0" and _may_confirm(ex, kwargs):
        beside = _Beside(exercise_id, source, kwargs)
        beside.start()
    gate: dict[str, Any] = {}

    def before_benchmark() -> bool:
        """The first run's tests passed: its benchmark waits for the confirmation's tests and
        is skipped when they failed (that failure is then the verdict: ``confirm``)."""
        assert beside is not None
        w0 = time.monotonic()
        beside.join()
        r = beside.usable()
        gate["waited_s"] = round(time.monotonic() - w0, 3)
        gate["skipped"] = r is not None and not r.passed
        return not gate["skipped"]

    hooks = {"before_benchmark": before_benchmark} if beside is not None else {}
    first = grade(exercise_id, source, progress=relay(""), **hooks, **kwargs)
    second: GradeResult | None = None
    if beside is not None:
        if beside.is_alive():
            beside.cancel()  # the first run ended before its benchmark: failed, or not timed
        second = beside.usable()
        if not gate and _memory_failure(first):  # out of memory beside the confirmation
            first = grade(exercise_id, source, progress=relay(""), **kwargs)
            second = None
    result = first
    if second is not None and gate.get("skipped"):
        # the confirmation failed, so the first run's benchmark was skipped: its verdict stands
        _replay(beside, relay("confirm-"))
        result = confirm(ex, first, second)
    elif first.passed and first.speedup is not None and not kwargs.get("trusted"):
        timed = retime(ex, first)
        beside_taken = second is not None and not timed
        if beside_taken:
            _replay(beside, relay("confirm-"))
        else:  # after the first run, on its own, with another secret
            again = {**kwargs, "secret": secrets.token_bytes(32), "timed": timed}
            second = grade(exercise_id, source, progress=relay("confirm-"), **again)
        assert second is not None
        result = confirm(ex, first, second)
        conf = result.details.get("confirmation")
        if conf is not None:  # where the confirmation's seconds went, for operators
            conf["beside_first"] = beside_taken
            conf["phase_s"] = second.details.get("phase_s")
            conf["elapsed_s"] = round(second.elapsed_s, 3)
            if "waited_s" in gate:  # the first run's benchmark waited this long for it
                conf["first_waited_s"] = gate["waited_s"]
    if beside is not None:
        result.elapsed_s = time.monotonic() - t0  # the two runs overlapped: the wall time
    if progress is not None:
        with contextlib.suppress(Exception):
            progress("done", 1, 1)
    return result


def _replay(beside: _Beside | None, report: ProgressFn) -> None:
    """A confirmation's progress, kept while it ran beside the first run, passed on now."""
    for phase, done, total in beside.events if beside is not None else []:
        report(phase, done, total)
