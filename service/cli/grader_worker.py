"""The grader's sidecar for ``kgrade serve``: one Celery worker beside gunicorn for ``make run``.

Only without ``REDIS_URL``: then broker and result backend need no server (kombu's
``filesystem://`` transport and SQLite under ``var/``, see ``workers.celery_app``), so
``make run`` grades submissions on its own. With ``REDIS_URL`` set, workers are deployed
separately (one per GPU; see deploy/README.md) and nothing is started here.

The sidecar also runs Celery beat (``-B``, its schedule file under the var dir) and consumes
the ``maint`` queue, so the stuck-job reaper runs under ``make run`` too (docs/faults.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from workers.queues import (
    QUEUE_CPU,
    QUEUE_GPU,
    QUEUE_GPU_X2,
    QUEUE_GPU_X4,
    QUEUE_MAINT,
    lti_worker_argv,
    worker_argv,
)


def embedded_worker(settings: dict[str, Any]) -> list[str] | None:
    env: dict[str, str] = settings.get("env") or dict(os.environ)
    if env.get("REDIS_URL"):
        return None
    device = env.get("KGRADE_GRADE_DEVICE", "cpu")
    # One process for every GPU queue: jobs run one at a time, each on the first GPUs it needs.
    queues = [QUEUE_CPU] if device == "cpu" else [QUEUE_GPU, QUEUE_GPU_X2, QUEUE_GPU_X4]
    # The same var dir as workers.celery_app.var_dir (not imported: it would load Celery here).
    var = Path(env.get("KGRADE_VAR_DIR") or Path.cwd() / "var").resolve()
    (var / "celery").mkdir(parents=True, exist_ok=True)
    schedule = str(var / "celery" / "beat-schedule")
    return worker_argv([*queues, QUEUE_MAINT], "embedded@%h", beat_schedule=schedule)


def embedded_lti_worker(settings: dict[str, Any]) -> list[str] | None:
    """The LMS-facing tasks' worker (grade passback, roster sync) beside gunicorn, on the same
    no-server transport; with ``REDIS_URL`` it is deployed on its own."""
    env: dict[str, str] = settings.get("env") or dict(os.environ)
    if env.get("REDIS_URL"):
        return None
    return lti_worker_argv("embedded-lti@%h")
