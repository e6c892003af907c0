"""Celery configuration rules of the grader spec (section 8) and the GPU health gate."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from workers import celery_app as ca


def test_redis_settings_nest_time_limits_under_one_visibility_timeout() -> None:
    app = ca.make_celery("redis://127.0.0.1:6379/0")
    c = app.conf
    assert c.broker_url == c.result_backend == "redis://127.0.0.1:6379/0"
    assert c.task_acks_late is True
    assert c.task_reject_on_worker_lost is True
    assert c.worker_prefetch_multiplier == 1
    assert c.worker_cancel_long_running_tasks_on_connection_loss is True
    assert c.worker_max_tasks_per_child and c.worker_max_memory_per_child
    assert ca.PHASE_BUDGET_S < c.task_soft_time_limit < c.task_time_limit
    vt = c.visibility_timeout
    assert c.broker_transport_options["visibility_timeout"] == vt
    assert c.result_backend_transport_options["visibility_timeout"] == vt
    # Late acks: a task outliving V runs twice. V >= 2x hard limit + one reserved task's wait.
    assert vt >= 3 * c.task_time_limit
    assert [q.name for q in c.task_queues] == ["cpu", "gpu", "gpu-x2", "gpu-x4", "maint"]
    assert c.task_default_queue == "cpu"


def test_without_redis_the_broker_needs_no_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("KGRADE_VAR_DIR", str(tmp_path))
    c = ca.make_celery().conf
    assert c.broker_url == "filesystem://"
    assert c.result_backend == f"db+sqlite:///{tmp_path / 'celery-results.sqlite3'}"
    opts = c.broker_transport_options
    assert opts["data_folder_in"] == opts["data_folder_out"]
    assert Path(opts["data_folder_in"]).is_dir()


def test_queue_routing_by_hardware() -> None:
    assert ca.queue_for("cpu", 2) == "cpu"
    assert ca.queue_for("cuda", 1) == "gpu"
    assert ca.queue_for("cuda", 2) == "gpu-x2"
    assert ca.queue_for("cuda", 4) == "gpu-x4"
    for gpus in (3, 5, 8):
        with pytest.raises(ValueError, match=f"no queue for {gpus} GPUs"):
            ca.queue_for("cuda", gpus)
    assert ca.device_for_queue("gpu-x2") == "cuda"
    assert ca.device_for_queue("gpu-x4") == "cuda"
    assert ca.device_for_queue("cpu") == "cpu"


def _fake_nvidia_smi(bin_dir: Path, apps: str, temp: str, listed_for: int | None = None) -> Path:
    """An ``nvidia-smi`` that logs its calls and lists ``apps`` (for its first ``listed_for``
    process queries only, when given) and ``temp``."""
    log = bin_dir / "calls.log"
    script = bin_dir / "nvidia-smi"
    until = (
        "" if listed_for is None else f'[ "$(grep -c compute-apps {log})" -le {listed_for} ] && '
    )
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        'case "$*" in\n'
        f"  *query-compute-apps*) {until}printf '{apps}' ;;\n"
        f"  *query-gpu*) printf '{temp}' ;;\n"
        "esac\n"
        "exit 0\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return log


def test_health_gate_asks_nvidia_smi_only_for_gpu_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _fake_nvidia_smi(tmp_path, "", "0, 41\\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(ca.GPUS_ENV, "0")
    assert ca.health_check("cpu") is None
    assert not log.exists()
    assert ca.health_check("cuda") is None
    assert "-i 0" in log.read_text()


def test_health_gate_refuses_foreign_process_and_heat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(ca, "GPU_SETTLE_S", 0.3)
    monkeypatch.setattr(ca, "GPU_SETTLE_POLL_S", 0.05)
    _fake_nvidia_smi(tmp_path, "4242, python\\n", "0, 41\\n")
    assert "foreign GPU process" in (ca.health_check("cuda") or "")
    _fake_nvidia_smi(tmp_path, "", "0, 97\\n")
    assert "97 C" in (ca.health_check("cuda") or "")


def test_health_gate_fails_closed_without_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ca.shutil, "which", lambda _name: None)
    assert "nvidia-smi not found" in (ca.health_check("cuda") or "")


def test_celery_side_never_imports_torch() -> None:
    """The Celery process must never touch CUDA: torch loads only in the job process."""
    import subprocess
    import sys

    code = (
        "import sys, workers.tasks, workers.celery_app; "
        "print(sorted(m for m in ('torch', 'triton', 'flask') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_health_gate_waits_for_a_killed_jobs_context_to_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run 26: a spare runner killed mid CUDA start-up stayed listed ("[No data]") for a moment
    # after its job; the gate took it for a foreign process and the worker left its queue.
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(ca, "GPU_SETTLE_POLL_S", 0.01)
    log = _fake_nvidia_smi(tmp_path, "5499, [No data]\\n", "0, 41\\n", listed_for=3)
    monkeypatch.setattr(ca, "GPU_SETTLE_S", 30.0)
    assert ca.health_check("cuda") is None
    assert log.read_text().count("compute-apps") == 4  # listed 3 times, then gone
    log.unlink()
    monkeypatch.setattr(ca, "GPU_SETTLE_S", 0.0)  # no settle time: the first listing counts
    assert "5499" in (ca.health_check("cuda") or "")
