"""The grader's sidecar for ``kgrade serve``: one Celery worker beside gunicorn for ``make run``.

Only without ``REDIS_URL``: then broker and result backend need no server (kombu's
``filesystem://`` transport and SQLite under ``var/``, see ``workers.celery_app``), so
``make run`` grades submissions on its own. With ``REDIS_URL`` set, workers are deployed
separately (one per GPU; see deploy/README.md) and nothing is started here.
"""

from __future__ import annotations

import os
from typing import Any

from workers.queues import QUEUE_CPU, QUEUE_GPU, QUEUE_GPU_X2, lti_worker_argv, worker_argv


def embedded_worker(settings: dict[str, Any]) -> list[str] | None:
    env: dict[str, str] = settings.get("env") or dict(os.environ)
    if env.get("REDIS_URL"):
        return None
    device = env.get("KGRADE_GRADE_DEVICE", "cpu")
    queues = [QUEUE_CPU] if device == "cpu" else [QUEUE_GPU, QUEUE_GPU_X2]
    return worker_argv(queues, "embedded@%h")


def embedded_lti_worker(settings: dict[str, Any]) -> list[str] | None:
    """The LMS-facing tasks' worker (grade passback, roster sync) beside gunicorn, on the same
    no-server transport; with ``REDIS_URL`` it is deployed on its own."""
    env: dict[str, str] = settings.get("env") or dict(os.environ)
    if env.get("REDIS_URL"):
        return None
    return lti_worker_argv("embedded-lti@%h")
