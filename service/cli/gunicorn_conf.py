"""gunicorn settings for the kgrade API: ``gunicorn -c python:service.cli.gunicorn_conf ...``.

``kgrade serve`` passes this module; a deployment that starts gunicorn itself should pass it
too. Command-line flags still win over these values.

Why these values: the API must answer every bad request with its own JSON error naming the
field (``{code, status, message, errors}``), so requests up to generous limits reach the app
(a 10,000-character ``Idempotency-Key`` gets the app's 400 that names the header), and
anything gunicorn itself must refuse beyond them gets the same JSON shape from the worker
class below instead of gunicorn's HTML page.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: The gthread worker (what ``--threads`` > 1 selects) with JSON error pages.
worker_class = "service.cli.gunicorn_worker.JsonErrorWorker"

#: gunicorn's logger, its access-log values made only as far as the format reads them (the
#: same lines, about 20 us less CPU a request).
logger_class = "service.cli.gunicorn_logger.AccessLogger"

#: Bytes in the request line (method, URL, version): gunicorn's own ceiling. Longer URLs get a
#: JSON 414 from the worker.
limit_request_line = 8190

#: Bytes in one header line. Long enough for any header the API reads to reach it and be
#: refused by name; beyond this the worker answers a JSON 431.
limit_request_field_size = 32768


def empty_multiproc_dir(folder: str | Path) -> None:
    """Make ``folder`` (a ``PROMETHEUS_MULTIPROC_DIR``) if missing and remove its counts, so
    those of an earlier run are not added to this one's (service/metrics.py)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    for stale in Path(folder).glob("*.db"):
        stale.unlink(missing_ok=True)


def on_starting(server: Any) -> None:
    """In the master, before any worker: ``empty_multiproc_dir`` on ``PROMETHEUS_MULTIPROC_DIR``."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        empty_multiproc_dir(folder)
