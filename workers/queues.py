"""Celery queues by hardware, and which one a job goes to (no Celery import: the API and the
CLI use this without creating a Celery app).

One worker process per GPU (``-c 1``) consumes ``gpu``; a worker holding two GPUs consumes
``gpu-x2`` (two-rank exercises such as ring attention), one holding four ``gpu-x4`` (four-rank
ones: ``ring-attention-x4``); CPU workers consume ``cpu``.
"""

from __future__ import annotations

import sys

QUEUE_CPU = "cpu"
QUEUE_GPU = "gpu"
QUEUE_GPU_X2 = "gpu-x2"
QUEUE_GPU_X4 = "gpu-x4"
QUEUES: tuple[str, ...] = (QUEUE_CPU, QUEUE_GPU, QUEUE_GPU_X2, QUEUE_GPU_X4)
#: The GPU queues by the GPUs a job of theirs holds (one rank per GPU).
GPU_QUEUES: dict[int, str] = {1: QUEUE_GPU, 2: QUEUE_GPU_X2, 4: QUEUE_GPU_X4}
#: Housekeeping (the stuck-job reaper, sent by Celery beat): consumed by the one process that
#: also runs beat (compose's ``maint``, Kubernetes' ``kgrade-maint``, ``make run``'s embedded
#: worker), never behind a grading; the message expires if nobody takes it in time.
QUEUE_MAINT = "maint"

#: The LMS-facing queue (grade passback, roster sync), consumed by a worker of the service's
#: (``celery -A service.worker``), never by a grading worker: a passback must not wait behind a
#: kernel grading.
QUEUE_LTI = "lti"
#: The task a grading worker sends, by name, when an assignment's submission got its final
#: result (the service posts the grade to the LMS). Named, so workers never import service.
GRADED_TASK = "kgrade.lti.grading_finished"


def queue_for(device: str, gpus: int = 1) -> str:
    """The queue for a job on ``device`` ("cpu" or "cuda") needing ``gpus`` GPUs."""
    if device == "cpu":
        return QUEUE_CPU
    if device != "cuda":
        raise ValueError(f"unknown device {device!r}")
    try:
        return GPU_QUEUES[max(1, gpus)]
    except KeyError:
        # No rounding up: a 3-rank job on a 4-GPU worker would leave one GPU idle unseen.
        raise ValueError(f"no queue for {gpus} GPUs (known: {sorted(GPU_QUEUES)})") from None


def device_for_queue(queue: str | None) -> str:
    """The device a message on ``queue`` is graded on (unknown queues count as CPU)."""
    return "cuda" if queue in GPU_QUEUES.values() else "cpu"


def lti_worker_argv(name: str) -> list[str]:
    """Command line of the worker of the LMS-facing tasks (``service.worker``): threads, since
    its tasks wait on HTTP, not on a GPU."""
    return _celery_worker("service.worker", [QUEUE_LTI], name, concurrency=4, pool="threads")


def worker_argv(
    queues: list[str] | tuple[str, ...], name: str, *, beat_schedule: str | None = None
) -> list[str]:
    """Command line of one grading worker process (``kgrade serve``'s sidecar, tests, deploys).

    One job at a time (``-c 1``, prefetch 1): the grader runs its own process tree per job, and
    on a GPU one job per device keeps timings honest. ``beat_schedule`` (a file) also runs
    Celery beat inside this worker (``-B``): for a single-process set-up only, since two beats
    would each send the schedule; deployments run one ``celery beat`` of their own.
    """
    extra = ["--prefetch-multiplier", "1"]
    if beat_schedule:
        extra += ["-B", "-s", beat_schedule]
    return _celery_worker(
        "workers.celery_app", queues, name, concurrency=1, pool="prefork", extra=extra
    )


def _celery_worker(
    app: str,
    queues: list[str] | tuple[str, ...],
    name: str,
    *,
    concurrency: int,
    pool: str,
    extra: list[str] | None = None,
) -> list[str]:
    # Mingle and gossip are off: workers share nothing but the broker.
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        app,
        "worker",
        "-Q",
        ",".join(queues),
        "-c",
        str(concurrency),
        "--pool",
        pool,
        *(extra or []),
        "-n",
        name,
        "--without-mingle",
        "--without-gossip",
        "-l",
        "info",
    ]
