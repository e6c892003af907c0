"""CI gate: every known solution of every exercise gets its expected verdict on CPU.

All gradings run concurrently (each is a separate process tree; threads only wait on pipes),
once per session, so the whole bank costs a few minutes even on two cores.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from workers.exercises import list_exercises, load_exercise
from workers.harness import grade
from workers.verdicts import Verdict

SOLUTIONS = [(ex_id, s) for ex_id in list_exercises() for s in load_exercise(ex_id).solutions()]
REQUIRED = {"attention-merge", "block-attention", "ring-attention", "nsa-attention"}


@pytest.fixture(scope="module")
def graded() -> dict[str, object]:
    workers = int(os.environ.get("KGRADE_TEST_JOBS", "3"))

    def run(item):  # type: ignore[no-untyped-def]
        ex_id, sol = item
        return f"{ex_id}:{sol.name}", grade(ex_id, sol.path.read_bytes(), device="cpu")

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(run, SOLUTIONS))


def test_bank_is_complete() -> None:
    assert set(list_exercises()) >= REQUIRED
    for ex_id in REQUIRED:
        sols = load_exercise(ex_id).solutions()
        assert any(s.expected is Verdict.PASS for s in sols), ex_id
        assert sum(s.expected is not Verdict.PASS for s in sols) >= 4, ex_id


@pytest.mark.parametrize(("ex_id", "sol"), SOLUTIONS, ids=[f"{e}:{s.name}" for e, s in SOLUTIONS])
def test_solution_verdict(graded: dict[str, object], ex_id: str, sol) -> None:  # type: ignore[no-untyped-def]
    r = graded[f"{ex_id}:{sol.name}"]
    assert r.verdict is sol.expected, f"{r.verdict.value}: {r.output}\n{r.logs[-2000:]}"
    doc = r.to_results_json()  # validates the schema too
    assert doc["gradable"] is True
    assert (doc["score"] > 0) == (sol.expected is Verdict.PASS)
    assert r.isolation != "none"
