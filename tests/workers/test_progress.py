"""Grading progress: the core's callback, its relay through the job process, the stored value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tests.workers.conftest import add_queued_submission
from workers import store as st
from workers import tasks
from workers.exercises import load_exercise
from workers.harness import grade
from workers.verdicts import Verdict

EXERCISE = "attention-merge"


def _correct_source() -> bytes:
    sol = next(s for s in load_exercise(EXERCISE).solutions() if s.expected is Verdict.PASS)
    return sol.path.read_bytes()


def _check_phases(
    events: list[tuple[str, int, int | None]], phases: list[str], *, complete: bool = True
) -> None:
    """Phases in order, each one's ``done`` never decreasing and (``complete``) ending at its
    total; coalesced writes may skip a phase's last update when the next phase follows at once.
    """
    assert [p for i, (p, _, _) in enumerate(events) if i == 0 or events[i - 1][0] != p] == phases
    for phase in phases:
        seen = [(d, t) for p, d, t in events if p == phase]
        dones = [d for d, _ in seen]
        assert dones == sorted(dones), (phase, seen)
        assert len({t for _, t in seen}) == 1, (phase, seen)
        assert not complete or dones[-1] == seen[-1][1], (phase, seen)


def test_grade_reports_progress_and_a_raising_callback_keeps_the_verdict() -> None:
    events: list[tuple[str, int, int]] = []

    def progress(phase: str, done: int, total: int) -> None:
        events.append((phase, done, total))
        raise RuntimeError("progress sink is down")  # every call raises: grading goes on

    res = grade(EXERCISE, _correct_source(), device="cpu", progress=progress)
    assert res.verdict is Verdict.PASS, res.output
    _check_phases(events, ["import", "tests", "done"])  # no benchmark on CPU
    tests = [(d, t) for p, d, t in events if p == "tests"]
    # one event at the phase start, then one per finished case
    assert tests == [(i, len(res.tests)) for i in range(len(res.tests) + 1)]
    assert events[-1] == ("done", 1, 1)
    # only fixed phase names and counts: nothing of the (hidden) cases' names
    assert all(isinstance(d, int) and isinstance(t, int) for _, d, t in events)


def test_coalescer_passes_phase_changes_at_once_and_throttles_within_a_phase() -> None:
    out: list[tuple[str, int, int | None]] = []
    c = tasks.ProgressCoalescer(lambda *e: out.append(e), interval=3600)
    c("tests", 0, 5)
    for i in range(1, 5):
        c("tests", i, 5)
    assert out == [("tests", 0, 5)] and c.pending()
    c.flush()
    assert out[-1] == ("tests", 4, 5) and not c.pending()
    c("tests", 4, 5)  # a repeat: nothing written
    c("done", 1, 1)  # a new phase: written at once
    assert out == [("tests", 0, 5), ("tests", 4, 5), ("done", 1, 1)]


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> st.SubmissionStore:
    url = f"sqlite:///{tmp_path / 'kgrade.sqlite3'}"
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("KGRADE_VAR_DIR", str(tmp_path / "var"))
    s = st.SubmissionStore(url)
    st._metadata.create_all(s.engine)
    return s


def test_task_relays_core_progress_into_the_store(
    store: st.SubmissionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole worker path: task -> ``python -m workers.job`` -> events pipe -> the DB."""
    source = _correct_source().decode()
    sid = add_queued_submission(store, source, exercise_id=EXERCISE)
    written: list[tuple[str, int, int | None]] = []
    real = st.SubmissionStore.set_progress

    def recording(self: st.SubmissionStore, sub_id: int, *event: Any) -> None:
        written.append(event)  # type: ignore[arg-type]
        real(self, sub_id, *event)

    monkeypatch.setattr(st.SubmissionStore, "set_progress", recording)
    out = tasks.grade_submission.apply(args=[sid]).get()
    assert out["verdict"] == "PASS"
    # the core's phases reached the database, in order, coalesced to a handful of writes
    assert written[0] == ("grading", 0, None)
    # the tests phase was stored while it ran (its start is written at once; later counts are
    # throttled, so which of them were written depends on timing)
    n_cases = len(store.results(sid)[0]["result"]["tests"])
    assert n_cases and ("tests", 0, n_cases) in written, written
    core = [e for e in written if e[0] != "grading"]
    _check_phases(core, ["import", "tests", "done"], complete=False)
    assert all(a != b for a, b in zip(written, written[1:], strict=False)), written  # no repeats
    t = st.submissions_table
    with store.engine.connect() as conn:
        row = conn.execute(select(t).where(t.c.id == sid)).one()
    assert row.status == st.DONE and row.progress_phase == "done"
    assert row.progress_done == row.progress_total == 1
