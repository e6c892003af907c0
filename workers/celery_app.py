"""The Celery application: broker, result backend, queues, limits and the health gate.

Two set-ups, chosen by the environment:

* ``REDIS_URL`` set: Redis is broker and result backend (deployment, ``make test``).
* ``REDIS_URL`` unset: kombu's ``filesystem://`` transport with folders under the var dir and a
  SQLite result backend, so ``make run`` grades without any broker server.

Rules from the grader spec (section 8) encoded here: late acks with prefetch 1 (a crashed job is
redelivered, never silently lost), ``task_reject_on_worker_lost`` (a killed pool process requeues
the job; the DB attempt cap in ``workers.tasks`` stops a crashing submission from looping), and
nested limits: phase budgets < soft limit < hard limit < visibility timeout.

What late acks cannot cover (docs/faults.md): a worker SIGKILLed as a whole leaves its message
unacked for the whole visibility timeout, and on a broker connection loss Celery cancels the
running job and acknowledges its message as revoked. The database is the record instead: Celery
beat runs ``workers.tasks.reap_stuck_jobs`` every ``KGRADE_REAP_INTERVAL_S`` on the ``maint``
queue, which requeues submissions whose job is gone (``workers.reaper``).

The Celery process never imports torch or touches CUDA: the grader core runs in a fresh process
(``workers.job``) that the task starts by exec, and the GPU health gate asks ``nvidia-smi`` in a
subprocess.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    task_prerun,
    worker_init,
    worker_shutdown,
)
from kombu import Exchange, Queue

from workers import metrics  # before anything imports prometheus_client: it picks the mode
from workers.logs import log_format, use_json
from workers.queues import (
    QUEUE_CPU,
    QUEUE_GPU,
    QUEUE_GPU_X2,
    QUEUE_GPU_X4,
    QUEUE_MAINT,
    QUEUES,
    device_for_queue,
    queue_for,
)
from workers.reaper import REAP_INTERVAL_S

log = logging.getLogger(__name__)

__all__ = [
    "QUEUES",
    "QUEUE_CPU",
    "QUEUE_GPU",
    "QUEUE_GPU_X2",
    "QUEUE_GPU_X4",
    "QUEUE_MAINT",
    "REAP_TASK",
    "app",
    "broker_reachable",
    "broker_settings",
    "device_for_queue",
    "health_check",
    "make_celery",
    "queue_for",
]

# Phase budgets of the grader (spec section 7): import 120 s + tests 180 s + benchmark 300 s. A
# passing timed submission is graded twice (confirmation run, spec section 6). With a paired
# baseline each grading also imports the submission anew and our reference beside it (2 x 120 s)
# and its benchmark takes both sides' calls (2 x 300 s); with a cached one a cold cache adds a
# whole grading of our reference (3 x 600 s). The larger of the two:
PHASE_BUDGET_S = max(2 * (3 * 120 + 180 + 2 * 300), 3 * (120 + 180 + 300))


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


#: Soft limit: the task gets SoftTimeLimitExceeded, kills the job's process group and records
#: TIMEOUT. It must exceed the sum of the phase budgets so the core's own timeouts fire first.
SOFT_TIME_LIMIT_S = _int_env("KGRADE_TASK_SOFT_TIME_LIMIT", PHASE_BUDGET_S + 300)
#: Hard limit: the pool process is killed (the job is then redelivered, up to the attempt cap).
HARD_TIME_LIMIT_S = _int_env("KGRADE_TASK_TIME_LIMIT", SOFT_TIME_LIMIT_S + 60)
#: Visibility timeout: with late acks, an unacked task older than this is handed to another
#: worker, so it must exceed 2x the hard limit plus the longest wait of a reserved message
#: (prefetch 1: at most one task ahead of it, itself bounded by the hard limit).
VISIBILITY_TIMEOUT_S = _int_env("KGRADE_VISIBILITY_TIMEOUT", 3 * HARD_TIME_LIMIT_S + 60)


#: The beat task that requeues stuck jobs (``workers.tasks.reap_stuck_jobs``).
REAP_TASK = "workers.tasks.reap_stuck_jobs"


def var_dir() -> Path:
    """Writable state for the server-less set-up; ``KGRADE_VAR_DIR`` or ``./var``."""
    return Path(os.environ.get("KGRADE_VAR_DIR") or Path.cwd() / "var").resolve()


def broker_settings(redis_url: str | None = None) -> dict[str, Any]:
    """Broker and result-backend settings for Redis, or for the no-server transport."""
    redis_url = redis_url if redis_url is not None else os.environ.get("REDIS_URL") or None
    vt: dict[str, Any] = {"visibility_timeout": VISIBILITY_TIMEOUT_S}
    if redis_url:
        broker_opts = dict(vt)
        # Lets several installations (or test runs) share one Redis without seeing each
        # other's queues: every broker key gets this prefix.
        prefix = os.environ.get("KGRADE_REDIS_KEYPREFIX")
        if prefix:
            broker_opts["global_keyprefix"] = prefix
        return {
            "broker_url": redis_url,
            "result_backend": redis_url,
            # The same visibility timeout on all three knobs (spec section 8): Celery reads
            # the broker's for redelivery and the backend's for its own unacked bookkeeping.
            "broker_transport_options": broker_opts,
            "result_backend_transport_options": dict(vt),
            "visibility_timeout": VISIBILITY_TIMEOUT_S,
        }
    root = var_dir() / "celery"
    queue_dir, processed, control = root / "queue", root / "processed", root / "control"
    for d in (queue_dir, processed, control):
        d.mkdir(parents=True, exist_ok=True)
    fs = {
        # Producer and consumer share one folder: messages are written and read there.
        "data_folder_in": str(queue_dir),
        "data_folder_out": str(queue_dir),
        "processed_folder": str(processed),
        "store_processed": False,
        "control_folder": str(control),
    }
    return {
        "broker_url": "filesystem://",
        "result_backend": f"db+sqlite:///{var_dir() / 'celery-results.sqlite3'}",
        "broker_transport_options": {**fs, **vt},
        "result_backend_transport_options": dict(vt),
        "visibility_timeout": VISIBILITY_TIMEOUT_S,
    }


def make_celery(redis_url: str | None = None) -> Celery:
    """Build the Celery app; ``redis_url`` overrides ``REDIS_URL`` (tests)."""
    app = Celery("kgrade", include=["workers.tasks"])
    queues = [
        Queue(name, Exchange(name, type="direct"), routing_key=name)
        for name in (*QUEUES, QUEUE_MAINT)
    ]
    app.conf.update(
        broker_settings(redis_url),
        task_queues=queues,
        task_default_queue=QUEUE_CPU,
        task_default_exchange=QUEUE_CPU,
        task_default_routing_key=QUEUE_CPU,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        # Redelivery semantics: a job is acknowledged only once it finished (or was capped).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # Without this, a broker connection loss lets the task run on here while the broker
        # redelivers it elsewhere: the same job twice on two GPUs.
        worker_cancel_long_running_tasks_on_connection_loss=True,
        task_soft_time_limit=SOFT_TIME_LIMIT_S,
        task_time_limit=HARD_TIME_LIMIT_S,
        # Hygiene: a fresh pool process every few jobs; a leak cannot grow across many jobs.
        worker_max_tasks_per_child=_int_env("KGRADE_WORKER_MAX_TASKS_PER_CHILD", 20),
        worker_max_memory_per_child=_int_env("KGRADE_WORKER_MAX_MEMORY_KB", 2_000_000),
        # On SIGTERM give the running job time to finish before the cold shutdown requeues it.
        worker_soft_shutdown_timeout=float(_int_env("KGRADE_WORKER_SOFT_SHUTDOWN_S", 60)),
        task_track_started=True,
        result_expires=7 * 24 * 3600,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        beat_schedule={
            "reap-stuck-jobs": {
                "task": REAP_TASK,
                "schedule": REAP_INTERVAL_S,
                # A run nobody took in time is dropped: the next one does the same work, and
                # none piles up behind busy workers.
                "options": {"queue": QUEUE_MAINT, "expires": REAP_INTERVAL_S},
            }
        },
    )
    return app


def broker_reachable(timeout_s: float = 2.0) -> bool:
    """Whether a message could be sent now: one connection to the broker, no retries.

    The API asks before storing a submission, so that an outage answers 503 instead of a row
    that nothing will grade until the broker is back.
    """
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=timeout_s)
        return True
    except Exception:  # noqa: BLE001 - any failure to connect means "not now"
        log.warning("the broker is unreachable", exc_info=True)
        return False


app = make_celery()
celery = app  # `celery -A workers.celery_app` finds either name


# --- health gate ------------------------------------------------------------------------------

#: GPUs assigned to this worker (indices for nvidia-smi -i); the deploy sets one per worker.
GPUS_ENV = "KGRADE_GPUS"
MAX_GPU_TEMPERATURE_C = _int_env("KGRADE_MAX_GPU_TEMPERATURE_C", 85)
#: How long a GPU process may stay listed before it counts as foreign. A runner killed while it
#: was still creating its CUDA context (a spare started ahead, when the tests failed first) is
#: gone from /proc at once, but the driver lists it ("[No data]") for a moment while it tears
#: the context down: run 26 saw it 0.2 s after such a job, and the worker left its queue.
GPU_SETTLE_S = float(_int_env("KGRADE_GPU_SETTLE_S", 15))
GPU_SETTLE_POLL_S = 0.25


def _nvidia_smi(args: list[str]) -> list[str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise RuntimeError("nvidia-smi not found")
    gpus = os.environ.get(GPUS_ENV)
    cmd = [exe, *(["-i", gpus] if gpus else []), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"nvidia-smi failed ({out.returncode}): {out.stderr.strip()[:200]}")
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


#: How each of the gate's sentences begins; ``unhealthy_kind`` reads them back for the metric.
FOREIGN_PROCESS = "foreign GPU process(es)"
PROBE_FAILED = "GPU health probe failed"
HOT_GPU = "GPU "  # "GPU <index> at <temperature> C"


def unhealthy_kind(reason: str) -> str:
    """The gate's sentence as one fixed word (no process ids or temperatures in a label)."""
    if reason.startswith(FOREIGN_PROCESS):
        return "foreign_process"
    if reason.startswith(PROBE_FAILED):
        return "probe_failed"
    if reason.startswith(HOT_GPU) and reason.endswith(" C"):
        return "temperature"
    return "other"


def gpu_health() -> str | None:
    """Why this worker's GPUs must not take a job now, or None when they may.

    Runs before every GPU job, when no job of ours is running: any compute process on our
    GPUs is foreign and would skew timings (spec section 5), and a hot GPU throttles.
    """
    try:
        apps = _gpu_processes()
        if apps:
            return f"{FOREIGN_PROCESS}: {'; '.join(apps)[:300]}"
        temps = _nvidia_smi(["--query-gpu=index,temperature.gpu", "--format=csv,noheader,nounits"])
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"{PROBE_FAILED}: {exc}"
    for line in temps:
        index, _, temp = line.partition(",")
        try:
            if int(temp.strip()) > MAX_GPU_TEMPERATURE_C:
                return f"{HOT_GPU}{index.strip()} at {temp.strip()} C"
        except ValueError:
            continue  # "[N/A]" on some boards: not a reason to refuse work
    return None


def _gpu_processes() -> list[str]:
    """The compute processes on our GPUs that outlast ``GPU_SETTLE_S``: our own last job's end
    once, and nothing from a true foreign process, which stays."""
    end = time.monotonic() + GPU_SETTLE_S
    query = ["--query-compute-apps=pid,process_name", "--format=csv,noheader"]
    apps = _nvidia_smi(query)
    while apps and time.monotonic() < end:
        time.sleep(GPU_SETTLE_POLL_S)
        apps = _nvidia_smi(query)
    return apps


def health_check(device: str) -> str | None:
    """The gate for one job: CPU jobs always pass; GPU jobs need an idle, cool GPU."""
    return gpu_health() if device == "cuda" else None


@task_prerun.connect
def _health_gate(task: Any = None, **_: Any) -> None:
    # Signal handlers cannot veto a task (Celery logs their exceptions), so the verdict is left
    # on the request; grade_submission reads it before touching the submission.
    if task is None or getattr(task, "name", "") != "workers.tasks.grade_submission":
        return
    queue = (task.request.delivery_info or {}).get("routing_key")
    task.request.kgrade_health = health_check(device_for_queue(queue)) or ""


# --- observability ---------------------------------------------------------------------------


@worker_init.connect
def _serve_metrics(**_: Any) -> None:
    # The main process, before the pool forks: the server thread lives where the pool's
    # children report to (workers.metrics). A port taken must not stop the worker grading.
    try:
        metrics.start_worker_server()
    except (OSError, ValueError):
        log.exception("worker metrics not served")


@worker_shutdown.connect
def _drop_metrics_dir(**_: Any) -> None:
    metrics.remove_multiproc_dir()


@after_setup_logger.connect
@after_setup_task_logger.connect
def _json_logs(logger: logging.Logger | None = None, **_: Any) -> None:
    # KGRADE_LOG_FORMAT=json: Celery's handlers write JSON lines with the request id.
    if logger is not None and log_format() == "json":
        for handler in logger.handlers:
            use_json(handler)
