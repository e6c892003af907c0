"""ring-attention-x4: the ring exercise graded with 4 ranks (issue 20), queue ``gpu-x4``.

A variant exercise (``variant_of: ring-attention`` in its spec.yaml): the base's statement,
starter, reference and known solutions, ``world_size: 4``. On CPU its gradings run four gloo
ranks; two known solutions are graded here (each CPU grading of 4 ranks takes 10-30 s, so not
all of them: tests/workers/test_solutions.py grades every one at 2 ranks).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from workers.exercises import ExerciseError, list_exercises, load_exercise
from workers.harness import grade
from workers.problems import load_problem
from workers.queues import QUEUE_GPU_X4, queue_for
from workers.verdicts import Verdict

X4 = "ring-attention-x4"


def test_variant_is_the_ring_exercise_with_four_ranks() -> None:
    base, x4 = load_exercise("ring-attention"), load_exercise(X4)
    assert X4 in list_exercises()
    assert (x4.variant_of, x4.world_size, base.world_size) == ("ring-attention", 4, 2)
    assert x4.title != base.title and "4 ranks" in x4.title
    # Everything else is the base's: files, cases, tolerances, limits, scoring, benchmark.
    assert x4.path == base.path and x4.reference == base.reference and x4.readme == base.readme
    for attr in ("entry", "signature", "public_cases", "hidden", "tolerance", "limits"):
        assert getattr(x4, attr) == getattr(base, attr), attr
    assert x4.benchmark == base.benchmark and x4.rehearsal == base.rehearsal
    assert [(s.name, s.expected, s.needs) for s in x4.solutions()] == [
        (s.name, s.expected, s.needs) for s in base.solutions()
    ]
    assert x4.cheat_bases() == base.cheat_bases()
    # What the API enqueues it on when grading on GPUs (service.core.submissions).
    assert queue_for("cuda", x4.world_size) == QUEUE_GPU_X4 == "gpu-x4"
    assert queue_for("cpu", x4.world_size) == "cpu"


def test_variant_cases_are_cut_into_four_rank_shards() -> None:
    x4 = load_exercise(X4)
    prob = load_problem(x4.problem)
    for case in prob.build_cases(x4, b"\x01" * 32, "nonce"):
        call = prob.materialize(x4, case)
        t = int(case.params["T"])
        assert len(call.inputs) == 4, case.name
        assert all(r["q"].shape[1] == t // 4 for r in call.inputs), case.name


@pytest.mark.parametrize(
    "ex_id", [e for e in list_exercises() if load_exercise(e).problem == "ring"]
)
def test_ring_lengths_split_into_every_layouts_chunks(ex_id: str) -> None:
    """Every T an exercise can draw (public, hidden, benchmark, rehearsal) splits into its
    world size's chunks: 2P for zigzag, P otherwise."""
    ex = load_exercise(ex_id)
    p = ex.world_size
    layouts = set(ex.hidden["layouts"])
    shapes = [(c["T"], {c["layout"]}) for c in ex.public_cases]
    shapes += [(t, layouts) for t in ex.hidden["T"]]
    shapes += [(s["T"], {s.get("layout", "zigzag")}) for s in ex.benchmark + ex.rehearsal]
    for t, lays in shapes:
        for layout in lays:
            parts = 2 * p if layout == "zigzag" else p
            assert int(t) % parts == 0, (ex_id, t, layout, p)


def _spec(root: Path, ex_id: str, text: str) -> None:
    (root / ex_id).mkdir()
    (root / ex_id / "spec.yaml").write_text(text)


def test_bad_variants_are_refused(tmp_path: Path) -> None:
    real = load_exercise("ring-attention").path / "spec.yaml"
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "spec.yaml").write_text(real.read_text())
    _spec(tmp_path, "ok", "variant_of: base\nworld_size: 4\n")
    assert load_exercise("ok", tmp_path).world_size == 4
    _spec(tmp_path, "self", "variant_of: self\n")
    _spec(tmp_path, "chain", "variant_of: ok\n")
    _spec(tmp_path, "nobase", "variant_of: nope\n")
    for ex_id, msg in (
        ("self", "names the exercise itself"),
        ("chain", "cannot be a variant itself"),
        ("nobase", "unknown exercise 'nope'"),
    ):
        with pytest.raises(ExerciseError, match=msg):
            load_exercise(ex_id, tmp_path)


@pytest.mark.slow
def test_known_solutions_get_their_verdicts_with_four_ranks() -> None:
    """The honest P2P ring passes every test on 4 gloo ranks; the one that all-gathers K/V is
    a policy violation there too (the c10d ops of each of the 4 ranks are counted)."""
    sols = {s.name: s for s in load_exercise(X4).solutions()}
    picked = [sols["correct/p2p_ring"], sols["wrong/all_gather"]]
    assert [s.expected for s in picked] == [Verdict.PASS, Verdict.POLICY_VIOLATION]
    # Two gradings side by side: each is a process tree that mostly waits on its four ranks.
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda s: grade(X4, s.source(), device="cpu"), picked))
    for sol, r in zip(picked, results, strict=True):
        assert r.verdict is sol.expected, (
            f"{sol.name}: {r.verdict.value}: {r.output}\n{r.logs[-2000:]}"
        )
        doc = r.to_results_json()  # validates the schema too
        assert doc["gradable"] is True and (doc["score"] > 0) == (sol.expected is Verdict.PASS)
        assert r.isolation != "none"
    passed = results[0]
    assert all(t.passed for t in passed.tests) and len(passed.tests) >= 7, passed.tests
    assert "K/V must move by P2P only" in results[1].output
