"""``kgrade serve``: migrate, then run the API under gunicorn (what ``make run`` does).

Extension point: a feature that needs another long-running process next to the web server (e.g.
the grader's Celery worker) appends a function to ``SIDECARS``. Each is called with the
resolved settings and returns an argv to start (or None to skip); ``serve`` then runs gunicorn
as a child, supervises the sidecars and stops them all together. With no sidecars gunicorn
replaces this process (exec), so signals reach it directly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from service.cli.db import DB_URL_OPTION, display_url, resolve_url, upgrade_and_import

Sidecar = Callable[[dict[str, Any]], list[str] | None]
SIDECARS: list[Sidecar] = []

# The grader: one Celery worker beside gunicorn when no REDIS_URL is set (make run).
from service.cli.grader_worker import embedded_lti_worker, embedded_worker  # noqa: E402

SIDECARS.append(embedded_worker)
SIDECARS.append(embedded_lti_worker)


GUNICORN_CONFIG = "python:service.cli.gunicorn_conf"


def gunicorn_argv(host: str, port: int, workers: int, threads: int, timeout: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        # JSON errors from gunicorn itself and header limits the API's own checks sit under.
        "--config",
        GUNICORN_CONFIG,
        "--bind",
        f"{host}:{port}",
        "--workers",
        str(workers),
        "--threads",
        str(threads),
        "--timeout",
        str(timeout),
        "--access-logfile",
        "-",
        "--access-logformat",
        '%(h)s "%(r)s" %(s)s %(b)s %(M)sms',
        "service:create_app()",
    ]


#: Processes of one thread each, as the container images run it (``--workers 4``): on the
#: 2-core machine, quiz traffic on PostgreSQL ran 6-19 % faster and cost 5-12 % less CPU a
#: request with 4 x 1 than with 3 x 2 in each of three alternating rounds (docs/perf.md, "Quiz
#: traffic under load"); a request's database waits then hand no GIL between threads.
DEFAULT_THREADS = 1


def default_workers() -> int:
    return min(4, 2 * (os.cpu_count() or 1))


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option(
    "--workers",
    default=default_workers,
    show_default="min(4, 2 x CPUs)",
    type=click.IntRange(1, 64),
)
@click.option("--threads", default=DEFAULT_THREADS, show_default=True, type=click.IntRange(1, 64))
@click.option("--timeout", default=60, show_default=True, type=int, help="Worker timeout (s).")
@click.option("--no-migrate", is_flag=True, help="Skip `kgrade db upgrade` before serving.")
@DB_URL_OPTION
def serve(
    host: str,
    port: int,
    workers: int,
    threads: int,
    timeout: int,
    no_migrate: bool,
    database_url: str | None,
) -> None:
    """Apply migrations, import the item bank, and serve the API with gunicorn."""
    url = resolve_url(database_url)
    if not no_migrate:
        upgrade_and_import(url)
    env = dict(os.environ, DATABASE_URL=url)
    # The workers need not re-import the bank: the upgrade above just did.
    env.setdefault("KGRADE_IMPORT_BANK", "0")
    argv = gunicorn_argv(host, port, workers, threads, timeout)
    click.echo(
        f"kgrade API on http://{host}:{port}/api/v1 (docs: /api/v1/docs), "
        f"database {display_url(url)}",
        err=True,
    )
    settings = {"host": host, "port": port, "database_url": url, "env": env}
    sidecars = [argv_ for make in SIDECARS if (argv_ := make(settings))]
    if not sidecars:
        os.execve(sys.executable, argv, env)
    _supervise(argv, sidecars, env)


def _supervise(web: list[str], sidecars: list[list[str]], env: dict[str, str]) -> None:
    procs = [subprocess.Popen(web, env=env)] + [subprocess.Popen(a, env=env) for a in sidecars]

    def stop(*_: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        # Any process exiting brings the whole service down, so a dead worker is noticed.
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
    finally:
        stop()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    sys.exit(procs[0].returncode or 0)
