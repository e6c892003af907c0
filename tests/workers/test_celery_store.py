"""The grading task's persistence: idempotent result upserts, attempt counting and the cap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from tests.workers.conftest import add_queued_submission
from workers import celery_app, metrics, tasks
from workers import store as st


def _result(verdict: str = "PASS", speedup: float | None = 1.5) -> dict[str, Any]:
    board = [{"name": "speedup", "value": speedup, "order": "desc"}] if speedup else []
    return {
        "score": 1.0 if verdict == "PASS" else 0.0,
        "gradable": verdict != "INFRA_ERROR",
        "verdict": verdict,
        "output": "",
        "tests": [],
        "leaderboard": board,
    }


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> st.SubmissionStore:
    url = f"sqlite:///{tmp_path / 'kgrade.sqlite3'}"
    monkeypatch.setenv("DATABASE_URL", url)
    s = st.SubmissionStore(url)
    st._metadata.create_all(s.engine)
    return s


def _add(s: st.SubmissionStore, attempts: int = 0) -> int:
    return add_queued_submission(s, "def f():\n    pass\n", attempts=attempts)


def _count_results(s: st.SubmissionStore, sid: int) -> int:
    r = st.results_table
    with s.engine.connect() as conn:
        return conn.execute(select(func.count()).where(r.c.submission_id == sid)).scalar_one()


def test_result_upsert_is_idempotent_and_first_final_result_wins(store: st.SubmissionStore) -> None:
    sid = _add(store)
    assert store.start_attempt(sid) == 1
    store.set_progress(sid, "tests", 2, 5)
    assert store.save_result(sid, 1, _result("WRONG_ANSWER", None)) is True
    # The same attempt written again (a retried write) stays one row, updated in place.
    assert store.save_result(sid, 1, _result("WRONG_ANSWER", None)) is False
    assert _count_results(store, sid) == 1
    # A late duplicate delivery's result is kept for the record but does not replace the verdict.
    assert store.save_result(sid, 2, _result("PASS")) is False
    sub = store.get(sid)
    assert sub is not None and sub.status == st.DONE and sub.verdict == "WRONG_ANSWER"
    assert store.start_attempt(sid) is None  # final: no further attempt starts


def test_speedup_only_from_passing_results(store: st.SubmissionStore) -> None:
    sid = _add(store)
    store.start_attempt(sid)
    store.save_result(sid, 1, _result("PASS", 1.25))
    with store.engine.connect() as conn:
        row = conn.execute(select(st.submissions_table).where(st.submissions_table.c.id == sid))
        assert row.one().speedup == 1.25


def test_attempt_cap_records_infra_error_without_grading(
    store: st.SubmissionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two deliveries already started and died (worker lost): the third must not grade again.
    sid = _add(store, attempts=tasks.MAX_RUNS)

    def boom(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the grader must not run past the attempt cap")

    monkeypatch.setattr(tasks, "run_job", boom)
    out = tasks.grade_submission.apply(args=[sid]).get()
    assert out["verdict"] == "INFRA_ERROR" and out["attempt"] == tasks.MAX_RUNS + 1
    sub = store.get(sid)
    assert sub is not None and sub.status == st.DONE and sub.verdict == "INFRA_ERROR"
    (row,) = store.results(sid)
    assert row["gradable"] is False and row["result"]["gradable"] is False
    # Delivered once more anyway: nothing changes, still one result.
    again = tasks.grade_submission.apply(args=[sid]).get()
    assert again == {"submission_id": sid, "status": st.DONE, "verdict": "INFRA_ERROR"}
    assert _count_results(store, sid) == 1


def test_missing_submission_is_dropped(store: st.SubmissionStore) -> None:
    assert tasks.grade_submission.apply(args=[987654]).get()["status"] == "missing"


def _timed(off: bool, rehearsal: bool = False) -> dict[str, Any]:
    """A passing GPU-timed result whose canary was (or was not) off its baseline's."""
    res = _result("PASS", 1.01)
    can = {"gpu_ms": 1.1, "host_ms": 0.9, "ratio": {"gpu_ms": 1.1 if off else 1.01}, "off": off}
    res["kgrade"] = {"details": {"canary": can, **({"rehearsal": True} if rehearsal else {})}}
    return res


def test_canary_off_requeues_once_then_keeps_the_result(
    store: st.SubmissionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(tasks.CANARY_REQUEUES_ENV, "1")
    runs: list[int] = []

    def job(*_a: Any, **_k: Any) -> dict[str, Any]:
        runs.append(1)
        return _timed(off=True)

    monkeypatch.setattr(tasks, "run_job", job)
    sid = _add(store)
    # eager: the retry is delivered at once (no countdown), as a worker would after 30 s
    tasks.grade_submission.apply(args=[sid])
    assert len(runs) == 2
    first, second = store.results(sid)
    why = first["result"]["requeued"]
    assert "canary off" in why and "gpu_ms 1.100" in why
    assert second["attempt"] == 2 and "requeued" not in second["result"]
    sub = store.get(sid)
    assert sub is not None and sub.status == st.DONE and sub.verdict == "PASS"
    assert sub.attempts == 2


@pytest.mark.parametrize(
    ("env", "result"),
    [
        ("0", _timed(off=True)),  # the default: requeues off
        ("1", _timed(off=False)),  # canary within 5 %
        ("1", _timed(off=True, rehearsal=True)),  # CPU timings: no speed to protect
        ("1", {**_timed(off=True), "verdict": "WRONG_ANSWER"}),  # nothing timed to redo
    ],
)
def test_results_that_are_not_requeued(
    store: st.SubmissionStore, monkeypatch: pytest.MonkeyPatch, env: str, result: dict[str, Any]
) -> None:
    monkeypatch.setenv(tasks.CANARY_REQUEUES_ENV, env)
    monkeypatch.setattr(tasks, "run_job", lambda *_a, **_k: result)
    sid = _add(store)
    out = tasks.grade_submission.apply(args=[sid]).get()
    assert out["attempt"] == 1 and _count_results(store, sid) == 1


def test_a_requeue_is_not_a_lost_worker(
    store: st.SubmissionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One attempt requeued for the canary, one lost with its worker: the third still grades.
    sid = _add(store)
    assert store.start_attempt(sid) == 1
    assert store.requeue(sid, 1, {**_timed(off=True), "requeued": "canary off"})
    assert store.start_attempt(sid) == 2  # this delivery's worker is lost mid-job
    monkeypatch.setattr(tasks, "run_job", lambda *_a, **_k: _timed(off=False))
    out = tasks.grade_submission.apply(args=[sid]).get()
    assert out == {"submission_id": sid, "attempt": 3, "verdict": "PASS"}
    # a final result is never requeued afterwards
    assert store.requeue(sid, 3, {**_timed(off=True), "requeued": "late"}) is False
    assert store.requeued(sid) == 1


def test_canary_requeues_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tasks.CANARY_REQUEUES_ENV, "2")
    assert tasks.canary_requeues() == 2
    for bad in ("x", "-1"):
        monkeypatch.setenv(tasks.CANARY_REQUEUES_ENV, bad)
        with pytest.raises(ValueError, match=tasks.CANARY_REQUEUES_ENV):
            tasks.canary_requeues()


def test_an_infra_error_is_retried_with_its_reason_logged(
    store: st.SubmissionStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The retry's result replaces the first one, so the log is where an operator finds why.
    results = iter([{**_result("INFRA_ERROR", None), "output": "reference failed: boom"}])
    monkeypatch.setattr(tasks, "run_job", lambda *_a, **_k: next(results, _result()))
    sid = _add(store)
    with caplog.at_level("ERROR", logger=tasks.log.name):
        out = tasks.grade_submission.apply(args=[sid]).get()
    assert out == {"submission_id": sid, "attempt": 2, "verdict": "PASS"}
    assert any("reference failed: boom" in r.getMessage() for r in caplog.records)


def test_a_failed_health_gate_requeues_uncharged_and_is_counted(
    store: st.SubmissionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run 26: a worker that leaves its queue must be seen; the count is what an alert reads.
    why = "foreign GPU process(es): 5499, [No data]"
    # the task_prerun gate (celery_app) and the task's own fallback for eager calls (tasks)
    monkeypatch.setattr(celery_app, "health_check", lambda _device: why)
    monkeypatch.setattr(tasks, "health_check", lambda _device: why)
    cancelled: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(
        tasks.app.control,
        "cancel_consumer",
        lambda q, destination: cancelled.append((q, destination)),
    )
    monkeypatch.setattr(tasks, "run_job", lambda *_a, **_k: pytest.fail("graded on a bad GPU"))
    counter = metrics.HEALTH_GATE_FAILURES.labels("cpu", "foreign_process")
    before = counter._value.get()
    sid = _add(store)
    result = tasks.grade_submission.apply(args=[sid])
    assert "health gate" in str(result.result)
    assert [q for q, _ in cancelled] == ["cpu"]
    assert counter._value.get() == before + 1
    sub = store.get(sid)
    assert sub is not None and sub.status == st.QUEUED and sub.attempts == 0


@pytest.mark.parametrize(
    ("why", "kind"),
    [
        ("foreign GPU process(es): 42, python", "foreign_process"),
        ("GPU 1 at 97 C", "temperature"),
        ("GPU health probe failed: nvidia-smi not found", "probe_failed"),
        ("something new", "other"),
    ],
)
def test_health_gate_failures_are_counted_by_kind(why: str, kind: str) -> None:
    counter = metrics.HEALTH_GATE_FAILURES.labels("gpu", kind)
    before = counter._value.get()
    metrics.record_health_gate_failure("gpu", celery_app.unhealthy_kind(why))
    assert counter._value.get() == before + 1
