"""The service's Celery worker: the grading app (``workers.celery_app``) with the LMS-facing
tasks registered (``service.lti.tasks``). Run it on the ``lti`` queue::

    celery -A service.worker worker -Q lti --pool threads -c 4

Grading workers keep running ``celery -A workers.celery_app`` (they never import service).
"""

from __future__ import annotations

import service.lti.tasks  # noqa: F401 - registers the tasks on the app
from workers.celery_app import app

celery = app

__all__ = ["app", "celery"]
