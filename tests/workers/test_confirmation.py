"""The confirmation run beside the first run (``grade_ranked``): which runs happen, in which
order, and whose verdict stands. The orchestration on stand-in gradings (fast); the real
processes in ``test_bench_rehearsal.py::test_ranked_score_is_confirmed_by_a_second_run`` and
below."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import workers.harness.parent as parent
from workers.harness import grade_ranked
from workers.harness.job import Job
from workers.harness.parent import CONCURRENT_CONFIRM_ENV, REHEARSAL_ENV
from workers.results import GradeResult, TestResult
from workers.verdicts import Verdict


def _result(verdict: Verdict, speedup: float | None, output: str = "") -> GradeResult:
    tests = [TestResult("hidden/0", 0.5, verdict is Verdict.PASS)]
    return GradeResult(
        exercise="attention-merge",
        verdict=verdict,
        score=1.0 if verdict is Verdict.PASS else 0.0,
        tests=tests,
        output=output or ("all 1 tests passed" if verdict is Verdict.PASS else verdict.value),
        speedup=speedup,
        run_id=f"run-{verdict.value}-{speedup}",
        details={"phase_s": {"import": 0.1, "tests": 0.1}},
    )


class Stand:
    """Stands in for ``grade``: the first run (it asks ``before_benchmark`` and is timed only if
    that says so), the confirmation beside it (``on_job`` given), and the runs made after it."""

    def __init__(
        self,
        first: Verdict = Verdict.PASS,
        beside: Verdict = Verdict.PASS,
        first_output: str = "",
        again: Verdict = Verdict.PASS,
    ) -> None:
        self.first, self.beside, self.first_output, self.again = first, beside, first_output, again
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, exercise_id: str, source: Any, **kw: Any) -> GradeResult:
        progress = kw.get("progress")
        if kw.get("on_job") is not None:  # beside the first run: untimed, its own secret
            assert kw["timed"] is False and kw["secret"]
            with self.lock:
                self.calls.append("beside")
            if progress:
                progress("import", 1, 1)
                progress("tests", 1, 1)
            return _result(self.beside, None)
        with self.lock:
            n_first = self.calls.count("first")
            self.calls.append("first" if "secret" not in kw else f"after:{kw['timed']}")
        if "secret" in kw:  # a confirmation after the first run
            if progress:
                progress("tests", 1, 1)
            return _result(self.again, 0.4 if kw["timed"] else None)
        if progress:
            progress("tests", 1, 1)
        if n_first == 0 and self.first is not Verdict.PASS:
            return _result(self.first, None, self.first_output)
        if kw.get("only_public"):  # no benchmark then
            return _result(Verdict.PASS, None)
        gate = kw.get("before_benchmark")
        if gate is not None and not gate():
            return _result(Verdict.PASS, None)  # benchmark skipped
        return _result(Verdict.PASS, 0.5)


@pytest.fixture
def stand(monkeypatch: pytest.MonkeyPatch) -> Stand:
    monkeypatch.setenv(REHEARSAL_ENV, "1")  # merge's rehearsal shapes: a speedup can follow
    monkeypatch.delenv(CONCURRENT_CONFIRM_ENV, raising=False)
    monkeypatch.setattr(parent, "retime", lambda ex, first: False)
    s = Stand()
    monkeypatch.setattr(parent, "grade", s)
    return s


def _ranked(**kw: Any) -> tuple[GradeResult, list[str]]:
    phases: list[str] = []
    r = grade_ranked(
        "attention-merge",
        "x",
        device="cpu",
        progress=lambda phase, done, total: phases.append(phase),
        **kw,
    )
    return r, phases


def test_a_confirmation_beside_the_first_run_is_taken(stand: Stand) -> None:
    r, phases = _ranked()
    assert r.verdict is Verdict.PASS and r.speedup == 0.5
    assert sorted(stand.calls) == ["beside", "first"]  # no run after the first
    conf = r.details["confirmation"]
    assert conf["beside_first"] is True and conf["timed"] is False
    assert "first_waited_s" in conf and conf["phase_s"] == {"import": 0.1, "tests": 0.1}
    # the caller still sees the first run's phases, then the confirmation's
    assert phases == ["tests", "confirm-import", "confirm-tests", "done"]


def test_a_failing_confirmation_beside_is_the_verdict_and_skips_the_benchmark(
    stand: Stand,
) -> None:
    stand.beside = Verdict.WRONG_ANSWER
    r, phases = _ranked()
    assert r.verdict is Verdict.WRONG_ANSWER and r.output.startswith("confirmation run")
    assert sorted(stand.calls) == ["beside", "first"]
    assert "confirm-tests" in phases and phases[-1] == "done"


@pytest.mark.parametrize("verdict", [Verdict.RESOURCE_LIMIT, Verdict.TIMEOUT, Verdict.INFRA_ERROR])
def test_a_confirmation_beside_that_may_owe_its_failure_to_it_runs_again_alone(
    stand: Stand, verdict: Verdict
) -> None:
    stand.beside = verdict
    r, _ = _ranked()
    assert r.verdict is Verdict.PASS and r.speedup == 0.5
    assert stand.calls[-1] == "after:False"  # the first run timed, then the confirmation alone
    assert r.details["confirmation"]["beside_first"] is False


def test_a_failing_first_run_needs_no_confirmation(stand: Stand) -> None:
    stand.first = Verdict.WRONG_ANSWER
    r, phases = _ranked()
    assert r.verdict is Verdict.WRONG_ANSWER and "confirmation" not in r.details
    assert "after:False" not in stand.calls and "confirm-tests" not in phases


def test_a_first_run_out_of_memory_beside_the_confirmation_is_graded_again_alone(
    stand: Stand,
) -> None:
    stand.first = Verdict.RESOURCE_LIMIT
    stand.first_output = "RESOURCE_LIMIT: tests: killed (out of memory?)"
    r, _ = _ranked()
    # graded again on its own (it passes there), then confirmed after it
    assert stand.calls.count("first") == 2 and stand.calls[-1] == "after:False"
    assert r.verdict is Verdict.PASS
    # any other resource failure stands
    stand.calls.clear()
    stand.first_output = "RESOURCE_LIMIT: output cap exceeded (stdout/stderr flood)"
    r, _ = _ranked()
    assert r.verdict is Verdict.RESOURCE_LIMIT and stand.calls.count("first") == 1


def test_a_confirmation_timed_again_runs_whole_after_the_first(
    stand: Stand, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parent, "retime", lambda ex, first: True)
    r, _ = _ranked()
    assert stand.calls[-1] == "after:True"  # with yet another secret, timed
    assert r.speedup == 0.4 and r.details["confirmation"]["beside_first"] is False


def test_no_confirmation_beside_where_none_can_follow_or_when_off(
    stand: Stand, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ranked(trusted=True)
    assert stand.calls == ["first"]  # our reference: never ranked
    stand.calls.clear()
    _ranked(only_public=True)
    assert stand.calls == ["first"]
    stand.calls.clear()
    monkeypatch.setenv(CONCURRENT_CONFIRM_ENV, "0")
    r, _ = _ranked()
    assert stand.calls == ["first", "after:False"]  # after the first run, as before
    assert r.details["confirmation"]["beside_first"] is False


# -- real processes (CPU rehearsal)


def test_a_confirmation_beside_ends_before_the_first_runs_benchmark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The confirmation's processes start while the first run imports and tests, and none of
    them is left once the first run's benchmark starts."""
    from workers.exercises import load_exercise

    monkeypatch.setenv(REHEARSAL_ENV, "1")
    monkeypatch.setattr(parent, "retime", lambda ex, first: False)
    sol = next(
        s for s in load_exercise("attention-merge").solutions() if s.name == "correct/stable_fp32"
    )
    starts: list[tuple[Job, float]] = []
    seen: dict[str, Any] = {}
    real_start, real_bench = Job.start_runner, parent.run_benchmark

    def start_runner(self: Job) -> None:
        starts.append((self, time.monotonic()))
        real_start(self)

    def run_benchmark(job: Job, *a: Any, **kw: Any) -> None:
        seen["bench"] = time.monotonic()
        # the confirmation's jobs (neither the first run's nor our reference's beside it)
        beside = [(j, t) for j, t in starts if j is not job and not j.trusted]
        seen["beside_started"] = [t for _, t in beside]
        # every process of theirs has ended by now
        seen["alive"] = sum(j.box is not None and j.box.proc.poll() is None for j, _ in beside)
        real_bench(job, *a, **kw)

    monkeypatch.setattr(Job, "start_runner", start_runner)
    monkeypatch.setattr(parent, "run_benchmark", run_benchmark)
    r = grade_ranked("attention-merge", sol.source(), device="cpu")
    assert r.verdict is Verdict.PASS, r.output
    conf = r.details["confirmation"]
    assert conf["beside_first"] is True and conf["timed"] is False
    # the confirmation's runner started before the first run's benchmark, and had ended
    assert seen["beside_started"] and max(seen["beside_started"]) < seen["bench"]
    assert seen["alive"] == 0


def test_a_failing_first_run_kills_the_confirmation_beside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from workers.exercises import load_exercise

    monkeypatch.setenv(REHEARSAL_ENV, "1")
    sol = next(s for s in load_exercise("attention-merge").solutions() if s.name == "wrong/zeros")
    killed: list[Job] = []
    real_kill = Job.kill

    def kill(self: Job) -> None:
        killed.append(self)
        real_kill(self)

    monkeypatch.setattr(Job, "kill", kill)
    r = grade_ranked("attention-merge", sol.source(), device="cpu")
    assert r.verdict is Verdict.WRONG_ANSWER, r.output
    assert "confirmation" not in r.details
    # the confirmation beside it was killed, unless it had ended already (it fails the same
    # way: a wrong answer stops its tests too)
    for job in killed:
        assert job.box is None or job.box.proc.poll() is not None
