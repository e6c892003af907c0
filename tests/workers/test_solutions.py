"""CI gate: every known solution of every exercise gets its expected verdict on CPU.

Solutions marked ``# needs: benchmark`` (timing cheats) are graded with the CPU rehearsal of
the benchmark loop, and so is one correct solution per exercise (the honest half of those
cheats: the timing checks must not touch it); ``# needs: gpu`` ones are graded only on a GPU
(the pipeline run and tests/workers/test_gpu.py). All gradings run concurrently (each is a
separate process tree; threads only wait on pipes), once per session.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from workers.exercises import base_exercises, list_exercises, load_exercise
from workers.harness import grade
from workers.verdicts import Verdict

#: Variants (``variant_of``: the same solutions at another world size) are left to their own
#: tests (tests/workers/test_ring_x4.py): all their solutions again would double CI's gradings.
EXERCISES = base_exercises()
SOLUTIONS = [(ex_id, s) for ex_id in EXERCISES for s in load_exercise(ex_id).solutions()]
#: The correct solutions the timing cheats are built on (their ``# include: ../correct/...``).
CHEAT_BASES = {f"{e}:{b}" for e in EXERCISES for b in load_exercise(e).cheat_bases()}


def rehearsed(ex_id: str, sol) -> bool:  # type: ignore[no-untyped-def]
    return sol.needs == "benchmark" or f"{ex_id}:{sol.name}" in CHEAT_BASES


REQUIRED = {
    "attention-merge",
    "block-attention",
    "ring-attention",
    "nsa-attention",
    "nsa-backward",
}


@pytest.fixture(scope="module")
def graded() -> dict[str, object]:
    workers = int(os.environ.get("KGRADE_TEST_JOBS", "3"))

    def run(item):  # type: ignore[no-untyped-def]
        ex_id, sol = item
        src = sol.source()
        return f"{ex_id}:{sol.name}", grade(
            ex_id, src, device="cpu", rehearsal=rehearsed(ex_id, sol)
        )

    todo = [(e, s) for e, s in SOLUTIONS if s.needs != "gpu"]
    # the longest first, so that none is left running alone at the end: a TIMEOUT runs to its
    # limit (ring's hangs: 71 s, last in the bank's order), a PASS through every test
    plain = sorted(
        (t for t in todo if not rehearsed(*t)),
        key=lambda t: (t[1].expected is not Verdict.TIMEOUT, t[1].expected is not Verdict.PASS),
    )
    with ThreadPoolExecutor(max_workers=workers) as pool:
        out = dict(pool.map(run, plain))
    # Timed loops one at a time, on an otherwise quiet machine: the wall-clock checks compare
    # the grader's clock with the reported times, and two cores shared by three gradings delay
    # the grader's wake-ups by milliseconds (docs/grading.md).
    out.update(map(run, [t for t in todo if rehearsed(*t)]))
    return out


def test_bank_is_complete() -> None:
    assert set(list_exercises()) >= REQUIRED
    for ex_id in REQUIRED:
        sols = load_exercise(ex_id).solutions()
        assert any(s.expected is Verdict.PASS for s in sols), ex_id
        assert sum(s.expected is not Verdict.PASS for s in sols) >= 4, ex_id


@pytest.mark.parametrize(("ex_id", "sol"), SOLUTIONS, ids=[f"{e}:{s.name}" for e, s in SOLUTIONS])
def test_solution_verdict(graded: dict[str, object], ex_id: str, sol) -> None:  # type: ignore[no-untyped-def]
    if sol.needs == "gpu":
        pytest.skip("only a GPU shows this verdict: graded by the GPU pipeline")
    r = graded[f"{ex_id}:{sol.name}"]
    assert r.verdict is sol.expected, f"{r.verdict.value}: {r.output}\n{r.logs[-2000:]}"
    doc = r.to_results_json()  # validates the schema too
    assert doc["gradable"] is True
    assert (doc["score"] > 0) == (sol.expected is Verdict.PASS)
    assert r.isolation != "none"
    if rehearsed(ex_id, sol) and sol.expected is Verdict.PASS:
        assert r.details.get("rehearsal") and r.timings, "the benchmark rehearsal ran"
    if sol.needs == "benchmark":  # the timed loop caught it, not the tests
        assert all(t.passed for t in r.tests if t.name != "benchmark"), r.output
        assert "benchmark" in r.output, r.output
