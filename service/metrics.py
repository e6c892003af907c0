"""Prometheus metrics of the API at ``/metrics`` (prometheus_client's text format).

What is counted where:

* per request (this module's ``before``/``after`` hooks): ``kgrade_http_requests_total`` and
  ``kgrade_http_request_duration_seconds`` by method and endpoint, the endpoint being Flask's
  URL rule (``/api/v1/submissions/<int:submission_id>``), never the raw path, so ids and
  scanners cannot grow the number of series;
* grade passbacks (``service.lti.tasks``, in the LMS worker): ``kgrade_grade_passbacks_total``
  by outcome (``sent``, ``superseded``, ``retry``, ``failed``), served on that worker's port;
* read at scrape time, whichever process did the work: ``kgrade_queue_depth`` per hardware
  queue (the Redis lists Celery's transport keeps, named after the queues) and
  ``kgrade_stuck_job_requeues_total`` (the total the database keeps, ``workers.reaper``);
* gradings (``workers.metrics``): counted by the grading workers, served on their own port.

gunicorn runs several processes: with ``PROMETHEUS_MULTIPROC_DIR`` set (before start, to an
empty directory of the API's own) every process writes its counts there and any of them answers
a scrape with the sum; without it each process answers with its own counts (fine for one
process, as under the test client). ``KGRADE_METRICS_TOKEN``, when set, is the bearer token a
scrape must present; without it ``/metrics`` is open, for a network where only Prometheus
reaches the port (deploy/README.md).
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from flask import Flask, Response, current_app, g, request
from flask_smorest import abort
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from workers.queues import QUEUES

log = logging.getLogger(__name__)

if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # prometheus_client writes there, never makes it
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)

METRICS_TOKEN_ENV = "KGRADE_METRICS_TOKEN"
#: Seconds Redis may take to answer the scrape's queue lengths before they are left out.
REDIS_TIMEOUT_S = 2.0
#: kombu's Redis transport keeps priorities 3, 6 and 9 in lists of their own beside the plain
#: one: a queue's depth is the sum of the four.
PRIORITY_SUFFIXES = ("", *(f"\x06\x16{p}" for p in (3, 6, 9)))
#: The endpoint label of a request no URL rule matched (404s, scanners).
UNMATCHED = "<unmatched>"

REQUESTS = Counter(
    "kgrade_http_requests",
    "HTTP requests answered, by method, endpoint (Flask URL rule) and status.",
    ["method", "endpoint", "status"],
)
LATENCY = Histogram(
    "kgrade_http_request_duration_seconds",
    "Time from the app receiving a request to its response, by method and endpoint.",
    ["method", "endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, float("inf")),
)
PASSBACKS = Counter(
    "kgrade_grade_passbacks",
    "Grade passbacks posted to an LMS, by outcome: sent, superseded (the LMS holds a newer "
    "score), retry (a transient failure, tried again later) or failed (given up or refused).",
    ["outcome"],
)


def count_passback(outcome: str) -> None:
    PASSBACKS.labels(outcome).inc()


def register_metrics(app: Flask) -> None:
    app.before_request(_start_timer)
    app.after_request(_count_request)
    app.add_url_rule("/metrics", "metrics", _metrics_view, methods=["GET"])


def _start_timer() -> None:
    g.kgrade_started = time.perf_counter()


#: (method, endpoint, status) -> its request counter and latency histogram. ``labels()``
#: validates and looks its series up under a lock on every call, half of this hook's cost; a
#: series, once made, is the same object for the process's life (nothing here removes one).
#: The endpoints are URL rules, so the keys are as few as the series.
_SERIES: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def _count_request(response: Response) -> Response:
    started = g.pop("kgrade_started", None)
    if started is None:  # a before_request hook ahead of ours answered first
        return response
    endpoint = request.url_rule.rule if request.url_rule is not None else UNMATCHED
    method, status = request.method, response.status_code
    series = _SERIES.get((method, endpoint, status))
    if series is None:
        series = (
            REQUESTS.labels(method, endpoint, str(status)),
            LATENCY.labels(method, endpoint),
        )
        _SERIES[(method, endpoint, status)] = series
    series[0].inc()
    series[1].observe(time.perf_counter() - started)
    return response


def _metrics_view() -> Response:
    token = current_app.config.get("METRICS_TOKEN", os.environ.get(METRICS_TOKEN_ENV)) or ""
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), token):
            abort(
                401,
                message="/metrics needs the metrics bearer token (KGRADE_METRICS_TOKEN)",
                headers={"WWW-Authenticate": 'Bearer realm="kgrade-metrics"'},
            )
    body = generate_latest(scrape_registry(current_app))
    return Response(body, content_type=CONTENT_TYPE_LATEST, headers={"Cache-Control": "no-store"})


def scrape_registry(app: Flask) -> CollectorRegistry:
    """What one scrape reports: this process's (or all processes') counts and the live ones."""
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_Forward(REGISTRY))
    registry.register(LiveCollector(app))
    return registry


class _Forward(Collector):
    """The process's default registry inside a per-scrape one."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        yield from self.source.collect()


class LiveCollector(Collector):
    """Values read when scraped: queue depths from Redis, stuck-job requeues from the DB.

    A dependency that does not answer leaves its metric out (and ``kgrade_scrape_up`` says
    which), so a Redis outage never turns the whole scrape into an error.
    """

    def __init__(self, app: Flask) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "kgrade_scrape_up",
            "Whether the scrape could read the source (1) or not (0).",
            labels=["source"],
        )
        if self._broker_url() is not None:  # the embedded transport has no lists to read
            depth = self._queue_depths()
            if depth is not None:
                yield depth
            up.add_metric(["broker"], 0.0 if depth is None else 1.0)
        requeues = self._stuck_requeues()
        if requeues is not None:
            yield requeues
        up.add_metric(["database"], 0.0 if requeues is None else 1.0)
        yield up

    def _broker_url(self) -> str | None:
        from service.health import broker_url

        return broker_url(self.app)

    def _queue_depths(self) -> GaugeMetricFamily | None:
        metric = GaugeMetricFamily(
            "kgrade_queue_depth",
            "Grading messages waiting in each hardware queue (Redis; not those being graded).",
            labels=["queue"],
        )
        import redis

        prefix = os.environ.get("KGRADE_REDIS_KEYPREFIX") or ""
        client = redis.Redis.from_url(
            str(self._broker_url()),
            socket_connect_timeout=REDIS_TIMEOUT_S,
            socket_timeout=REDIS_TIMEOUT_S,
        )
        try:
            with client.pipeline(transaction=False) as pipe:
                for queue in QUEUES:
                    for suffix in PRIORITY_SUFFIXES:
                        pipe.llen(f"{prefix}{queue}{suffix}")
                lengths = pipe.execute()
        except Exception:  # noqa: BLE001 - any Redis failure: no depths in this scrape
            log.warning("metrics: could not read the queue lengths", exc_info=True)
            return None
        finally:
            client.close()
        n = len(PRIORITY_SUFFIXES)
        for i, queue in enumerate(QUEUES):
            metric.add_metric([queue], float(sum(lengths[i * n : (i + 1) * n])))
        return metric

    def _stuck_requeues(self) -> CounterMetricFamily | None:
        from service.extensions import db
        from workers.reaper import stuck_requeues_total

        try:
            with self.app.app_context():
                total = stuck_requeues_total(db.engine)
        except Exception:  # noqa: BLE001 - a database outage: the metric is left out
            log.warning("metrics: could not read the stuck-job requeues", exc_info=True)
            return None
        return CounterMetricFamily(
            "kgrade_stuck_job_requeues",
            "Submissions the stuck-job reaper put back in a queue, since the start.",
            value=float(total),
        )
