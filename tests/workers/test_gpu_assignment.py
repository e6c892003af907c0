"""Which GPU a job runs on, and what keys its reference baseline (no GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.exercises import load_exercise
from workers.harness.bench import _ref_key
from workers.harness.job import job_gpus
from workers.results import GradeResult
from workers.verdicts import Verdict


@pytest.mark.parametrize(
    ("kgrade_gpus", "visible", "world", "gpus", "cuda_visible"),
    [
        ("1", None, 1, [1], "1"),  # the second worker of a two-GPU host: only GPU 1
        ("0,1", None, 2, [0, 1], "0,1"),  # the two-GPU worker's ring job
        ("2,3", None, 1, [2], "2"),  # a one-rank job on a multi-GPU worker takes its first GPU
        (None, "3", 1, [3], "3"),  # no worker setting: CUDA_VISIBLE_DEVICES as given
        (None, None, 2, [0, 1], "0,1"),  # nothing set: the first `world` GPUs
        (None, "GPU-5f1c", 1, [0], "GPU-5f1c"),  # UUIDs are passed through untouched
    ],
)
def test_job_gpus(
    monkeypatch: pytest.MonkeyPatch,
    kgrade_gpus: str | None,
    visible: str | None,
    world: int,
    gpus: list[int],
    cuda_visible: str,
) -> None:
    for name, value in (("KGRADE_GPUS", kgrade_gpus), ("CUDA_VISIBLE_DEVICES", visible)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    got, env = job_gpus(world)
    assert got == gpus
    assert env["CUDA_VISIBLE_DEVICES"] == cuda_visible
    # CUDA's default order (fastest first) would not match nvidia-smi's and /dev/nvidiaN's
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def _result(gpu_line: str) -> GradeResult:
    return GradeResult(
        exercise="attention-merge",
        verdict=Verdict.PASS,
        score=1.0,
        device="cuda",
        run_id="r",
        harness_hash="h",
        versions={"torch": "2.11.0", "triton": "3.6.0"},
        hardware={"gpus": [gpu_line]},
    )


def test_baseline_key_ignores_clocks_and_temperature() -> None:
    ex = load_exercise("attention-merge")
    shape = {"name": "s", "params": {"T": 16}}
    cool = "NVIDIA H200, 580.159.04, 143771 MiB, 1980 MHz, 3201 MHz, 31, 0x0000000000000000"
    warm = "NVIDIA H200, 580.159.04, 143771 MiB, 1755 MHz, 3201 MHz, 44, 0x0000000000000001"
    other = "NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB, 1980 MHz, 2619 MHz, 31, 0x0"
    # the same board at another temperature keeps its baseline; another board does not
    assert _ref_key(ex, shape, _result(cool)) == _ref_key(ex, shape, _result(warm))
    assert _ref_key(ex, shape, _result(cool)) != _ref_key(ex, shape, _result(other))


def test_operator_comm_settings_reach_the_clean_job_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.harness.job import operator_comm_env

    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")  # the worker's own secrets stay behind
    env = operator_comm_env()
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert "AWS_SECRET_ACCESS_KEY" not in env


def _setenv_pairs(argv: list[str]) -> dict[str, str]:
    return {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--setenv"}


@pytest.mark.parametrize(("view", "visible"), [("local", "0"), ("physical", "1"), ("all", "1")])
def test_bwrap_gpu_view(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, view: str, visible: str
) -> None:
    from workers.sandbox import GPU_VIEW_ENV, SandboxSpec, build_argv

    monkeypatch.setenv(GPU_VIEW_ENV, view)
    spec = SandboxSpec(
        cwd=tmp_path,
        rw_paths=[tmp_path],
        env={"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        device="cuda",
        gpu_indices=[1],
        isolation="bwrap",
    )
    argv, iso = build_argv(spec, ["python3", "-c", "pass"])
    assert iso == "bwrap"
    # the second worker's job: GPU 1 is its only GPU, numbered as the view says
    assert _setenv_pairs(argv)["CUDA_VISIBLE_DEVICES"] == visible


def test_bad_gpu_view_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.sandbox import GPU_VIEW_ENV, gpu_view

    monkeypatch.setenv(GPU_VIEW_ENV, "everything")
    with pytest.raises(ValueError, match=GPU_VIEW_ENV):
        gpu_view()


def test_job_env_gives_our_reference_a_worker_wide_triton_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from workers.harness.job import REF_TRITON_CACHE_ENV
    from workers.tasks import job_env

    monkeypatch.setenv("KGRADE_VAR_DIR", str(tmp_path))
    monkeypatch.delenv(REF_TRITON_CACHE_ENV, raising=False)
    assert job_env()[REF_TRITON_CACHE_ENV] == str(tmp_path / "ref-triton")
    monkeypatch.setenv(REF_TRITON_CACHE_ENV, "/srv/cache")  # an operator's choice wins
    assert job_env()[REF_TRITON_CACHE_ENV] == "/srv/cache"
