"""Prometheus metrics of the grading workers, and the HTTP server that exposes them.

Counted in the process that grades (a Celery pool process) and served by the worker's main
process on ``KGRADE_METRICS_PORT`` (``start_worker_server``, on Celery's ``worker_init``). A
prefork pool grades in child processes, so their values reach the main process only through
prometheus_client's multiprocess mode: files in ``PROMETHEUS_MULTIPROC_DIR``, one directory per
worker (never shared with the API or another worker: the worker wipes it at start).
``multiproc_dir_for_worker`` sets one up when only the port was given.

The queue depths and the stuck-job requeues are not counted here: the API reads them from Redis
and the database at scrape time (``service.metrics``), so they are right whichever process did
the work, and a scrape of any API pod gives the same answer.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

METRICS_PORT_ENV = "KGRADE_METRICS_PORT"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiproc_dir_for_worker() -> None:
    """Give a worker asked to serve metrics a multiprocess directory of its own when none is
    set, so that what its pool processes count reaches its port.

    Must run before prometheus_client is first imported (it reads the variable at import);
    ``workers.celery_app`` calls it first thing. The API never sets ``KGRADE_METRICS_PORT``,
    and a process that already loaded prometheus_client is left as it is.
    """
    wanted = os.environ.get(METRICS_PORT_ENV) and not os.environ.get(MULTIPROC_ENV)
    if wanted and "prometheus_client" not in sys.modules:
        os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="kgrade-metrics-")


multiproc_dir_for_worker()
if os.environ.get(MULTIPROC_ENV):  # prometheus_client writes there but never makes it
    Path(os.environ[MULTIPROC_ENV]).mkdir(parents=True, exist_ok=True)

from prometheus_client import (  # noqa: E402 - after the multiprocess directory is chosen
    CollectorRegistry,
    Counter,
    Histogram,
    multiprocess,
    start_http_server,
)

#: Gradings last from seconds (a CPU test run) to the better part of an hour (a timed GPU
#: grading run twice beside our reference).
GRADING_BUCKETS = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 2400, float("inf"))

GRADING_SECONDS = Histogram(
    "kgrade_grading_duration_seconds",
    "Wall time of one grading attempt, by exercise and queue.",
    ["exercise", "queue"],
    buckets=GRADING_BUCKETS,
)
PHASE_SECONDS = Histogram(
    "kgrade_grading_phase_seconds",
    "Time of one phase of a grading (the grader's details.phase_s), by exercise and phase.",
    ["exercise", "phase"],
    buckets=GRADING_BUCKETS,
)
VERDICTS = Counter(
    "kgrade_verdicts",
    "Final verdicts of submissions, by exercise and verdict.",
    ["exercise", "verdict"],
)


HEALTH_GATE_FAILURES = Counter(
    "kgrade_health_gate_failures",
    "Jobs refused by a worker's health gate, after which it stopped consuming the queue, by "
    "queue and reason (foreign_process, temperature, probe_failed, other). Alert on any.",
    ["queue", "reason"],
)


def record_health_gate_failure(queue: str, kind: str) -> None:
    """Count one gate failure by ``kind`` (``workers.celery_app.unhealthy_kind``)."""
    HEALTH_GATE_FAILURES.labels(queue, kind).inc()


def record_grading(exercise: str, queue: str, result: dict[str, Any], seconds: float) -> None:
    """Count one grading attempt: its duration, its phases and (``final``) its verdict."""
    GRADING_SECONDS.labels(exercise, queue).observe(seconds)
    details = (result.get("kgrade") or {}).get("details") or {}
    for phase, value in (details.get("phase_s") or {}).items():
        if isinstance(value, int | float):
            PHASE_SECONDS.labels(exercise, str(phase)).observe(float(value))


def record_verdict(exercise: str, verdict: str) -> None:
    VERDICTS.labels(exercise, verdict).inc()


def metrics_port() -> int | None:
    raw = (os.environ.get(METRICS_PORT_ENV) or "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"{METRICS_PORT_ENV} must be a port number, got {raw!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"{METRICS_PORT_ENV} must be between 1 and 65535, got {port}")
    return port


def start_worker_server() -> int | None:
    """Serve this worker's metrics on ``KGRADE_METRICS_PORT`` (a thread of the calling
    process); the port, or None when it is not set. Wipes the multiprocess directory of other
    processes' files first: values left by an earlier run would be counted again (this
    process's own may already hold counts)."""
    port = metrics_port()
    if port is None:
        return None
    folder = os.environ.get(MULTIPROC_ENV)
    if folder:
        for stale in Path(folder).glob("*.db"):
            if not stale.stem.endswith(f"_{os.getpid()}"):
                stale.unlink(missing_ok=True)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        start_http_server(port, registry=registry)
    else:  # a single-process worker (threads pool): its own registry is all there is
        start_http_server(port)
    log.info("worker metrics on port %s (%s)", port, folder or "one process")
    return port


def remove_multiproc_dir() -> None:
    """Remove a directory ``multiproc_dir_for_worker`` made (on worker shutdown)."""
    folder = os.environ.get(MULTIPROC_ENV) or ""
    if Path(folder).name.startswith("kgrade-metrics-") and Path(folder).parent == Path(
        tempfile.gettempdir()
    ):
        shutil.rmtree(folder, ignore_errors=True)
