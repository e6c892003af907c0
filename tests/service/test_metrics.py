"""Prometheus metrics: the API's /metrics, the workers' port, and where each value comes from."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from flask import Flask
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, update

from service import create_app
from service.db import Base, load_models
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
SUBMISSION_RULE = "/api/v1/submissions/<db_id:submission_id>"


def _app(tmp_path: Path, **config: Any) -> Flask:
    url = f"sqlite:///{tmp_path / 'k.sqlite3'}"
    load_models()
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
    return create_app(
        {"DATABASE_URL": url, "IMPORT_BANK": False, "TESTING": True, "REDIS_URL": "", **config}
    )


def _scrape(app: Flask, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    res = app.test_client().get("/metrics", headers=headers)
    assert res.status_code == 200, res.get_data(as_text=True)
    assert res.headers["Content-Type"].startswith("text/plain; version=")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(res.get_data(as_text=True))
        for s in fam.samples
    }


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_requests_are_counted_per_url_rule_not_per_path(tmp_path: Path) -> None:
    app = _app(tmp_path)
    c = app.test_client()
    labels = {"method": "GET", "endpoint": SUBMISSION_RULE, "status": "401"}
    before = _value("kgrade_http_requests_total", **labels)
    unmatched = {"method": "GET", "endpoint": "<unmatched>", "status": "404"}
    before_404 = _value("kgrade_http_requests_total", **unmatched)
    for sid in (1, 2, 987654):
        assert c.get(f"/api/v1/submissions/{sid}").status_code == 401
    assert c.get(f"/no-such-page/{uuid.uuid4()}").status_code == 404
    metrics = _scrape(app)
    key = tuple(sorted(labels.items()))
    assert metrics[("kgrade_http_requests_total", key)] == before + 3
    assert metrics[("kgrade_http_requests_total", tuple(sorted(unmatched.items())))] == (
        before_404 + 1
    )
    hist = tuple(sorted({"method": "GET", "endpoint": SUBMISSION_RULE}.items()))
    assert metrics[("kgrade_http_request_duration_seconds_count", hist)] >= 3
    # No raw path became a label: the ids are in no series' name or labels (only there: a
    # float such as a histogram's sum may hold the digits 987654 by chance, as one CI run's did).
    text = app.test_client().get("/metrics").get_data(as_text=True)
    series = [line.rpartition(" ")[0] for line in text.splitlines() if not line.startswith("#")]
    assert series and not [s for s in series if "987654" in s or "no-such-page" in s]
    # make run's embedded transport has no queues to read; the database has the requeues.
    assert ("kgrade_scrape_up", (("source", "database"),)) in metrics
    assert ("kgrade_scrape_up", (("source", "broker"),)) not in metrics


def test_metrics_token_when_set(tmp_path: Path) -> None:
    app = _app(tmp_path, METRICS_TOKEN="s3cret-metrics")
    c = app.test_client()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-metrics"}):
        res = c.get("/metrics", headers=headers)
        assert res.status_code == 401, headers
        assert "KGRADE_METRICS_TOKEN" in res.get_json()["message"]
        assert res.headers["WWW-Authenticate"].startswith("Bearer")
    assert _scrape(app, Authorization="Bearer s3cret-metrics")


def test_queue_depth_per_hardware_queue_from_redis(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"kgt-metrics-{uuid.uuid4().hex[:8]}:"
    monkeypatch.setenv("KGRADE_REDIS_KEYPREFIX", prefix)
    client = redis.Redis.from_url(redis_url)
    keys = [f"{prefix}gpu", f"{prefix}gpu\x06\x163", f"{prefix}cpu"]
    try:
        client.rpush(keys[0], "m1", "m2", "m3")
        client.rpush(keys[1], "m4")  # kombu's list for priority 3 of the same queue
        client.rpush(keys[2], "m5")
        client.rpush(f"{prefix}maint", "not a grading queue")
        metrics = _scrape(_app(tmp_path, REDIS_URL=redis_url))
    finally:
        client.delete(*keys, f"{prefix}maint")
        client.close()
    depth = {k[1][0][1]: v for k, v in metrics.items() if k[0] == "kgrade_queue_depth"}
    assert depth == {"cpu": 1.0, "gpu": 4.0, "gpu-x2": 0.0, "gpu-x4": 0.0}
    assert metrics[("kgrade_scrape_up", (("source", "broker"),))] == 1.0


def test_an_unreachable_broker_leaves_the_depths_out_not_the_scrape(tmp_path: Path) -> None:
    metrics = _scrape(_app(tmp_path, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"))
    assert not [k for k in metrics if k[0] == "kgrade_queue_depth"]
    assert metrics[("kgrade_scrape_up", (("source", "broker"),))] == 0.0
    assert metrics[("kgrade_scrape_up", (("source", "database"),))] == 1.0


def test_stuck_job_requeues_come_from_the_database(tmp_path: Path) -> None:
    from tests.workers.conftest import add_queued_submission
    from workers import store as st

    # The workers' tables alone (no foreign keys to the service's): all the reaper reads.
    url = f"sqlite:///{tmp_path / 'w.sqlite3'}"
    s = st.SubmissionStore(url)
    st._metadata.create_all(s.engine)
    app = create_app({"DATABASE_URL": url, "IMPORT_BANK": False, "TESTING": True})
    a, b = (add_queued_submission(s, f"def f{i}():\n    pass\n") for i in range(2))
    with s.engine.begin() as conn:
        t = st.submissions_table
        conn.execute(update(t).where(t.c.id == a).values(stuck_requeues=2))
        conn.execute(update(t).where(t.c.id == b).values(stuck_requeues=3))
    metrics = _scrape(app)
    assert metrics[("kgrade_stuck_job_requeues_total", ())] == 5.0
    assert metrics[("kgrade_scrape_up", (("source", "database"),))] == 1.0


def test_passback_outcomes_are_counted() -> None:
    from service.lti import tasks as lti_tasks

    session = SimpleNamespace(commit=lambda: None)
    before = {o: _value("kgrade_grade_passbacks_total", outcome=o) for o in ("sent", "failed")}
    for status in ("sent", "failed", "failed"):
        row = SimpleNamespace(status="pending", http_status=None, error=None)
        assert lti_tasks._finish(session, row, status, 200, None) == (status, None)  # type: ignore[arg-type]
    assert _value("kgrade_grade_passbacks_total", outcome="sent") == before["sent"] + 1
    assert _value("kgrade_grade_passbacks_total", outcome="failed") == before["failed"] + 2


def test_a_grading_records_its_duration_phases_and_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.workers.conftest import add_queued_submission
    from workers import store as st
    from workers import tasks

    url = f"sqlite:///{tmp_path / 'w.sqlite3'}"
    monkeypatch.setenv("DATABASE_URL", url)
    s = st.SubmissionStore(url)
    st._metadata.create_all(s.engine)
    exercise = f"ex-{uuid.uuid4().hex[:6]}"
    sid = add_queued_submission(s, "def f():\n    pass\n", exercise_id=exercise)
    result = {
        "score": 0.0,
        "gradable": True,
        "verdict": "WRONG_ANSWER",
        "output": "",
        "tests": [],
        "leaderboard": [],
        "kgrade": {"details": {"phase_s": {"import": 0.5, "tests": 2.0}}},
    }
    monkeypatch.setattr(tasks, "run_job", lambda *_a, **_k: result)
    assert tasks.grade_submission.apply(args=[sid]).get()["verdict"] == "WRONG_ANSWER"
    tasks.grade_submission.apply(args=[sid]).get()  # already final: not counted again
    assert _value("kgrade_verdicts_total", exercise=exercise, verdict="WRONG_ANSWER") == 1
    assert _value("kgrade_grading_duration_seconds_count", exercise=exercise, queue="cpu") == 1
    assert _value("kgrade_grading_phase_seconds_sum", exercise=exercise, phase="tests") == 2.0
    assert _value("kgrade_grading_phase_seconds_count", exercise=exercise, phase="import") == 1


def _get(url: str, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as res:
                return res.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_worker_port_serves_what_a_forked_pool_process_counted(tmp_path: Path) -> None:
    """A prefork worker: the pool child counts, the main process serves (multiprocess mode,
    with a directory of its own made when only KGRADE_METRICS_PORT is set)."""
    port = free_port()
    script = textwrap.dedent(
        f"""
        import os, sys, time
        import workers.celery_app  # what `celery -A workers.celery_app worker` imports
        from workers import metrics
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"], "no multiprocess directory"
        assert metrics.start_worker_server() == {port}
        pid = os.fork()
        if pid == 0:  # the pool process grades
            metrics.record_grading("fork-ex", "gpu", {{"kgrade": {{"details": {{"phase_s":
                {{"benchmark": 7.5}}}}}}}}, 12.0)
            metrics.record_verdict("fork-ex", "PASS")
            os._exit(0)
        os.waitpid(pid, 0)
        print("ready", flush=True)
        time.sleep(30)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["KGRADE_METRICS_PORT"] = str(port)
    env["TMPDIR"] = str(tmp_path)  # where the worker makes its multiprocess directory
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        text = _get(f"http://127.0.0.1:{port}/metrics")
    finally:
        proc.kill()
        proc.wait(timeout=10)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert samples[("kgrade_verdicts_total", (("exercise", "fork-ex"), ("verdict", "PASS")))] == 1
    key = (("exercise", "fork-ex"), ("phase", "benchmark"))
    assert samples[("kgrade_grading_phase_seconds_sum", key)] == 7.5


def test_gunicorn_like_processes_are_summed_in_multiprocess_mode(tmp_path: Path) -> None:
    """Two API processes answer requests; a third answers the scrape with both counts."""
    folder = tmp_path / "prom"
    folder.mkdir()
    db = tmp_path / "k.sqlite3"
    load_models()
    engine = create_engine(f"sqlite:///{db}")
    Base.metadata.create_all(engine)
    engine.dispose()
    script = textwrap.dedent(
        f"""
        import sys
        from service import create_app
        app = create_app({{"DATABASE_URL": "sqlite:///{db}", "IMPORT_BANK": False,
                          "TESTING": True, "REDIS_URL": ""}})
        c = app.test_client()
        for _ in range(int(sys.argv[1])):
            assert c.get("/healthz").status_code == 200
        if sys.argv[2] == "scrape":
            sys.stdout.write(c.get("/metrics").get_data(as_text=True))
        """
    )
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(folder))
    env.pop("KGRADE_METRICS_PORT", None)
    run = [sys.executable, "-c", script]
    procs = [subprocess.Popen([*run, n, "no"], cwd=ROOT, env=env) for n in ("2", "3")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    out = subprocess.run(
        [*run, "1", "scrape"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(out)
        for s in fam.samples
    }
    key = (("endpoint", "/healthz"), ("method", "GET"), ("status", "200"))
    assert samples[("kgrade_http_requests_total", key)] == 6  # 2 + 3 + the scraper's own 1
