"""Quiz-submission throughput of the kgrade API under gunicorn, on SQLite and PostgreSQL.

For each database this starts gunicorn (``service:create_app()``) on a fresh database, creates an
unlimited-attempts copy of a bank quiz and student tokens, then drives it from a bounded pool of
loopback client threads (keep-alive ``http.client``): each client loops start attempt -> answer
every item -> submit, for a fixed duration. It prints requests/s, attempts/s and latency
percentiles. PostgreSQL runs when ``KGRADE_TEST_DATABASE_URL`` is set (``make services``), in a
schema of its own that is dropped afterwards.

    .venv/bin/python benchmarks/bench_submissions.py --workers 4 --clients 8 --duration 10

This is a measurement, not a test: numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, seconds: float) -> None:
        with self.lock:
            self.latencies.setdefault(kind, []).append(seconds)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(
    conn: http.client.HTTPConnection, method: str, path: str, token: str, body: Any = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    data = None
    if body is not None:
        data = json.dumps(body)
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    raw = resp.read()
    return resp.status, json.loads(raw) if raw else None


def _prepare(url: str, students: int) -> tuple[str, list[str], str]:
    """Migrate, store a bench quiz without attempt limits, make tokens. Returns quiz, tokens."""
    from sqlalchemy.orm import Session

    from item_bank import all_quizzes, dump_quiz, load_quiz
    from service.auth import create_token
    from service.db import make_engine, write_intent
    from service.migrations import upgrade
    from service.quizzes_store import create_quiz

    upgrade(url)
    data = dump_quiz(all_quizzes()[0])
    data["id"] = "bench-quiz"
    data["settings"]["allowed_attempts"] = None
    engine = make_engine(url)
    with write_intent(), Session(engine) as session:
        create_quiz(session, load_quiz(data))
        prof = create_token(session, role="instructor", name="bench-prof")[1]
        tokens = [
            create_token(session, role="student", name=f"bench-{i}")[1] for i in range(students)
        ]
        session.commit()
    engine.dispose()
    return "bench-quiz", tokens, prof


def _client_loop(port: int, token: str, quiz_id: str, deadline: float, stats: Stats) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            status, attempt = _request(
                conn, "POST", f"/api/v1/quizzes/{quiz_id}/attempts", token, {"lang": "en"}
            )
            stats.add("start", time.perf_counter() - t0)
            if status != 201:
                stats.errors.append(f"start {status} {attempt}")
                return
            aid = attempt["id"]
            for item in attempt["items"]:
                t0 = time.perf_counter()
                status, body = _request(
                    conn,
                    "POST",
                    f"/api/v1/attempts/{aid}/responses",
                    token,
                    {"item_id": item["id"], "answer": [item["options"][0]["id"]]},
                )
                stats.add("answer", time.perf_counter() - t0)
                if status != 201:
                    stats.errors.append(f"answer {status} {body}")
                    return
            t0 = time.perf_counter()
            status, body = _request(conn, "POST", f"/api/v1/attempts/{aid}/submit", token)
            stats.add("submit", time.perf_counter() - t0)
            if status != 200:
                stats.errors.append(f"submit {status} {body}")
                return
            with stats.lock:
                stats.attempts += 1
    except Exception as exc:  # report, don't hang the benchmark
        stats.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError("gunicorn exited during start-up")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/api/v1/openapi.json")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not become ready")


def run_backend(name: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    quiz_id, tokens, _ = _prepare(url, args.clients)
    port = _free_port()
    env = dict(os.environ, DATABASE_URL=url, KGRADE_IMPORT_BANK="0")
    cmd = [
        sys.executable, "-m", "gunicorn",
        "--bind", f"127.0.0.1:{port}",
        "--workers", str(args.workers),
        "--threads", str(args.threads),
        "--log-level", "warning",
        "service:create_app()",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT)
    try:
        _wait_ready(port, proc)
        # Warm-up: every worker imports, connects and parses the quiz once.
        warm = Stats()
        _client_loop(port, tokens[0], quiz_id, time.perf_counter() + 1.0, warm)
        stats = Stats()
        start = time.perf_counter()
        deadline = start + args.duration
        threads = [
            threading.Thread(target=_client_loop, args=(port, tok, quiz_id, deadline, stats))
            for tok in tokens
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    all_lat = [x for v in stats.latencies.values() for x in v]
    q = statistics.quantiles(all_lat, n=100) if len(all_lat) > 1 else [0.0] * 99
    sub = stats.latencies.get("submit", [0.0])
    sub_q = statistics.quantiles(sub, n=100) if len(sub) > 1 else [sub[0]] * 99
    return {
        "backend": name,
        "workers": args.workers,
        "threads": args.threads,
        "clients": args.clients,
        "seconds": elapsed,
        "requests": len(all_lat),
        "attempts": stats.attempts,
        "req_s": len(all_lat) / elapsed,
        "att_s": stats.attempts / elapsed,
        "p50_ms": q[49] * 1000,
        "p95_ms": q[94] * 1000,
        "submit_p95_ms": sub_q[94] * 1000,
        "errors": stats.errors,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4, help="gunicorn workers")
    ap.add_argument("--threads", type=int, default=2, help="threads per gunicorn worker")
    ap.add_argument("--clients", type=int, default=8, help="concurrent client threads")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per backend")
    ap.add_argument("--backends", default="sqlite,postgres")
    args = ap.parse_args()

    results = []
    wanted = args.backends.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        if "sqlite" in wanted:
            results.append(run_backend("sqlite", f"sqlite:///{tmp}/bench.sqlite3", args))
        pg = os.environ.get("KGRADE_TEST_DATABASE_URL")
        if "postgres" in wanted and pg:
            results.append(_run_postgres(pg, args))
        elif "postgres" in wanted:
            print("postgres: skipped (KGRADE_TEST_DATABASE_URL not set)", file=sys.stderr)

    cols = ["backend", "workers", "threads", "clients", "attempts", "requests", "req_s", "att_s",
            "p50_ms", "p95_ms", "submit_p95_ms"]  # fmt: skip
    print(f"cpus={os.cpu_count()} duration={args.duration:g}s per backend; one attempt = "
          "1 start + N answers + 1 submit")  # fmt: skip
    print(" | ".join(f"{c:>13}" for c in cols))
    for r in results:
        cells = [f"{r[c]:13.1f}" if isinstance(r[c], float) else f"{r[c]!s:>13}" for c in cols]
        print(" | ".join(cells))
    for r in results:
        for e in r["errors"][:5]:
            print(f"{r['backend']} error: {e}", file=sys.stderr)
    if any(r["errors"] for r in results):
        sys.exit(1)


def _run_postgres(base: str, args: argparse.Namespace) -> dict[str, Any]:
    from sqlalchemy import create_engine, text

    from service.config import normalize_database_url

    base = normalize_database_url(base)
    schema = f"kgbench_{secrets.token_hex(4)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in base else "?"
    try:
        return run_backend("postgres", f"{base}{sep}options=-csearch_path%3D{schema}", args)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


if __name__ == "__main__":
    main()
