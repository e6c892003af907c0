"""The grading task's persistence: idempotent result upserts, attempt counting and the cap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from tests.workers.conftest import add_queued_submission
from workers import store as st
from workers import tasks


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
