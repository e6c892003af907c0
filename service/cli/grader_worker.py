"""The grader's sidecar for ``kgrade serve``: one Celery worker beside gunicorn for ``make run``.

Only without ``REDIS_URL``: then broker and result backend need no server (kombu's
``filesystem://`` transport and SQLite under ``var/``, see ``workers.celery_app``), so
``make run`` grades submissions on its own. With ``REDIS_URL`` set, workers are deployed
separately (one per GPU; see deploy/README.md) and nothing is started here.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from workers.queues import QUEUE_CPU, QUEUE_GPU, QUEUE_GPU_X2


def embedded_worker(settings: dict[str, Any]) -> list[str] | None:
    env: dict[str, str] = settings.get("env") or dict(os.environ)
    if env.get("REDIS_URL"):
        return None
    device = env.get("KGRADE_GRADE_DEVICE", "cpu")
    queues = [QUEUE_CPU] if device == "cpu" else [QUEUE_GPU, QUEUE_GPU_X2]
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.celery_app",
        "worker",
        "-Q",
        ",".join(queues),
        # One job at a time: the grader runs its own process tree per job, and on a GPU one
        # job per device keeps timings honest.
        "-c",
        "1",
        "--pool",
        "prefork",
        "--prefetch-multiplier",
        "1",
        "-n",
        "embedded@%h",
        # No other workers to sync with on a single machine.
        "--without-mingle",
        "--without-gossip",
        "-l",
        "info",
    ]
