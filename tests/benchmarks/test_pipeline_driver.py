"""The GPU pipeline driver's selection of what to grade (benchmarks/pipeline_gpu.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def drv() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "pipeline_gpu", ROOT / "benchmarks/pipeline_gpu.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["pipeline_gpu"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_picks_and_reference_exercises_select_exactly(drv: ModuleType) -> None:
    jobs, refs, skipped = drv.collect(
        ["attention-merge", "ring-attention"],
        3,
        2,
        "all",
        ["ring-attention:correct/p2p_ring", "attention-merge:wrong/zeros"],
        ["attention-merge"],
    )
    assert [(j.exercise, j.name) for j in jobs] == [
        ("attention-merge", "wrong/zeros"),
        ("ring-attention", "correct/p2p_ring"),
    ]
    assert [j.name for j in refs] == ["reference#1", "reference#2", "reference#3"]
    assert {j.exercise for j in refs} == {"attention-merge"} and not skipped


def test_two_rank_exercises_are_skipped_on_one_gpu(drv: ModuleType) -> None:
    jobs, refs, skipped = drv.collect(["ring-attention"], 5, 1, "one")
    assert not jobs and not refs and skipped and "needs 2 GPUs" in skipped[0]


def test_one_correct_and_one_wrong_per_exercise(drv: ModuleType) -> None:
    jobs, refs, _ = drv.collect(["block-attention"], 0, 1, "one")
    assert [j.expected == "PASS" for j in jobs] == [True, False] and not refs


def test_unknown_solution_is_a_usage_error(
    drv: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        drv.main(["--token", "t", "--solution", "attention-merge:correct/nope"])
    assert e.value.code == 2
    assert "unknown --solution attention-merge:correct/nope" in capsys.readouterr().err
