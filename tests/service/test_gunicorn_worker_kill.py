"""A gunicorn worker SIGKILLed while students take quizzes: no 500, gunicorn replaces the worker
and the API keeps answering, nothing acknowledged is lost and nothing is half-written.

The API runs as deployed: real gunicorn (``service.cli.serve.gunicorn_argv``, the config of
``service/cli/gunicorn_conf.py``, 2 workers) on the real PostgreSQL of ``make test`` (a schema
of its own). Client threads take attempts over HTTP (start, answer both items, submit), each
request on a fresh connection and with an ``Idempotency-Key``, as a careful client would. One
worker is frozen (SIGSTOP) at a moment when it holds a client's connection, then SIGKILLed, so
at least one request dies in flight. A request that fails at the connection level is retried
with the same key until it gets an answer: its effect must then be there exactly once (the
replay of a committed first try, or a fresh try after a rollback), never twice and never half.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from item_bank import load_quiz
from service import create_app
from service.cli.serve import gunicorn_argv
from service.db import Base, load_models, write_intent
from tests.conftest import ROOT, free_port, stop_group
from tests.service.conftest import QUIZ_B

STUDENTS = 6
#: What each student answers, and the points it must be stored with (QUIZ_B: one point each).
ANSWERS = {"x1": (["two"], 1.0), "x2": (["five"], 0.0)}
#: Connection-level failures tolerated per request before the test gives up on the API.
MAX_TRIES = 50
#: Socket state ESTABLISHED in /proc/net/tcp.
TCP_ESTABLISHED = "01"


@dataclass
class Load:
    """What the client threads saw."""

    statuses: Counter[int] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    #: connection-level failures, by request kind and exception type
    dropped: Counter[str] = field(default_factory=Counter)
    #: how a request retried after a drop was answered: "replayed" (its first try had
    #: committed: the stored answer) or "fresh" (its first try had been rolled back)
    retried: Counter[str] = field(default_factory=Counter)
    #: attempt id -> student, for every start the API acknowledged (201)
    attempts: dict[str, str] = field(default_factory=dict)
    #: (attempt id, item) -> (answer, points) the API acknowledged
    answers: dict[tuple[str, str], tuple[list[str], float]] = field(default_factory=dict)
    #: attempt id -> score of an acknowledged submit
    submitted: dict[str, float] = field(default_factory=dict)
    #: every Idempotency-Key that got its answer
    keys: set[str] = field(default_factory=set)
    successes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Api:
    """HTTP to the gunicorn under test: one connection per request (closed after it)."""

    def __init__(self, port: int, token: str, load: Load) -> None:
        self.port = port
        self.token = token
        self.load = load

    def post(self, path: str, key: str, body: Any, want: tuple[int, ...]) -> dict[str, Any]:
        """POST until an HTTP answer comes (same key every time); it must be one of ``want``."""
        data = json.dumps(body).encode() if body is not None else b""
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Idempotency-Key": key,
            "Content-Type": "application/json",
            "Connection": "close",
        }
        for tries in range(MAX_TRIES):
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
            try:
                conn.request("POST", path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                # The worker holding this request died: retry it with the same key.
                with self.load.lock:
                    self.load.dropped[f"{path.rsplit('/', 1)[-1]} {type(exc).__name__}"] += 1
                time.sleep(0.05)
                continue
            finally:
                conn.close()
            replayed = resp.getheader("Idempotent-Replayed") == "true"
            with self.load.lock:
                self.load.statuses[resp.status] += 1
                if tries:
                    self.load.retried["replayed" if replayed else "fresh"] += 1
                elif replayed:  # a key is never reused: only a retry may be a replay
                    self.load.unexpected.append(f"POST {path}: a first try was a replay")
                if resp.status not in want:
                    self.load.unexpected.append(f"POST {path}: {resp.status} {raw[:300]!r}")
                    raise AssertionError(self.load.unexpected[-1])
                self.load.successes += 1
                self.load.keys.add(key)
            return json.loads(raw)
        raise AssertionError(f"POST {path}: no answer after {MAX_TRIES} tries")


def _student(api: Api, name: str, load: Load, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        attempt = api.post(
            "/api/v1/quizzes/quiz-b/attempts", f"{name}-{n}-start", {"lang": "en"}, (201,)
        )
        aid = attempt["id"]
        with load.lock:
            load.attempts[aid] = name
        for item, (answer, points) in ANSWERS.items():
            fb = api.post(
                f"/api/v1/attempts/{aid}/responses",
                f"{name}-{n}-{item}",
                {"item_id": item, "answer": answer},
                (201,),  # each item answered once: a replayed retry is still the first answer
            )
            assert fb["points"] == points and fb["times_answered"] == 1, fb
            with load.lock:
                load.answers[(aid, item)] = (answer, points)
        result = api.post(f"/api/v1/attempts/{aid}/submit", f"{name}-{n}-submit", None, (200,))
        with load.lock:
            load.submitted[aid] = result["score"]


# --- the server -------------------------------------------------------------------------------


def _children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process is gone
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _client_connections(pid: int, port: int) -> int:
    """Established TCP connections to ``port`` that process ``pid`` holds open (requests it
    accepted and has not finished)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        local_port = int(cols[1].rsplit(":", 1)[1], 16)
        if local_port == port and cols[3] == TCP_ESTABLISHED and cols[9] in inodes:
            count += 1
    return count


@pytest.fixture
def database(pg_schema_factory: Any) -> tuple[str, dict[str, str]]:
    """A PostgreSQL schema with kgrade's tables, quiz B and six student tokens."""
    from service.auth import create_token
    from service.extensions import db
    from service.quizzes_store import create_quiz

    url = pg_schema_factory("kgkill")
    load_models()
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
    app = create_app({"DATABASE_URL": url, "IMPORT_BANK": False, "REDIS_URL": ""})
    tokens = {}
    with app.app_context(), write_intent():
        for i in range(STUDENTS):
            tokens[f"s{i}"] = create_token(db.session, role="student", name=f"s{i}")[1]
        create_quiz(db.session, load_quiz(copy.deepcopy(QUIZ_B)))
        db.session.commit()
    app.extensions["kgrade.db"][0].dispose()
    return url, tokens


@dataclass
class Gunicorn:
    proc: subprocess.Popen[bytes]
    port: int
    access_log: Path
    error_log: Path

    def served_by(self) -> Counter[int]:
        """Requests in the access log, by worker pid."""
        pids = re.findall(r"^pid=<(\d+)> ", self.access_log.read_text(), re.M)
        return Counter(int(p) for p in pids)


@pytest.fixture
def gunicorn(database: tuple[str, dict[str, str]], tmp_path: Path) -> Iterator[Gunicorn]:
    url, _ = database
    port = free_port()
    access_log, error_log = tmp_path / "access.log", tmp_path / "error.log"
    argv = gunicorn_argv("127.0.0.1", port, workers=2, threads=2, timeout=30)
    app_spec = argv.pop()  # service:create_app()
    argv += [
        "--access-logfile", str(access_log),
        "--access-logformat", 'pid=%(p)s %(s)s "%(r)s"',
        "--error-logfile", str(error_log),
        app_spec,
    ]  # fmt: skip
    env = dict(os.environ, DATABASE_URL=url, KGRADE_IMPORT_BANK="0", KGRADE_VAR_DIR=str(tmp_path))
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "prom")  # as deployed (compose, k8s)
    for var in ("REDIS_URL", "KGRADE_METRICS_PORT"):
        env.pop(var, None)
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
    server = Gunicorn(proc, port, access_log, error_log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, error_log.read_text()[-3000:]
            assert time.monotonic() < deadline, "gunicorn did not start"
            booted = error_log.read_text().count("Booting worker") if error_log.exists() else 0
            if booted >= 2 and len(_children(proc.pid)) == 2:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                    conn.request("GET", "/healthz")
                    if conn.getresponse().status == 200:
                        break
                except OSError:
                    pass
                finally:
                    conn.close()
            time.sleep(0.2)
        yield server
    finally:
        stop_group(proc, 20)


def _kill_a_worker_mid_request(server: Gunicorn) -> tuple[int, int]:
    """SIGKILL one worker while it holds a client's connection; (its pid, requests it held)."""
    workers = sorted(_children(server.proc.pid))
    assert len(workers) == 2, workers
    deadline = time.monotonic() + 30
    while True:
        for victim in workers:
            os.kill(victim, signal.SIGSTOP)  # frozen: it can neither answer nor accept
            held = _client_connections(victim, server.port)
            if held or time.monotonic() > deadline:
                os.kill(victim, signal.SIGKILL)
                return victim, held
            os.kill(victim, signal.SIGCONT)
        time.sleep(0.01)


def test_sigkilled_gunicorn_worker_loses_and_duplicates_nothing(
    database: tuple[str, dict[str, str]], gunicorn: Gunicorn
) -> None:
    url, tokens = database
    load = Load()
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(name: str, token: str) -> None:
        try:
            _student(Api(gunicorn.port, token, load), name, load, stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(name, token), daemon=True)
        for name, token in tokens.items()
    ]
    for t in threads:
        t.start()
    # generous waits: they bound a failure, and CI's two cores may be busy with other work
    deadline = time.monotonic() + 60
    while load.successes < 60:
        assert not errors, errors
        assert time.monotonic() < deadline, f"too little traffic before the kill: {load.statuses}"
        time.sleep(0.05)

    original = _children(gunicorn.proc.pid)
    victim, held = _kill_a_worker_mid_request(gunicorn)
    before_kill = load.successes
    assert held >= 1, "the killed worker held no client request"

    # gunicorn forks a replacement, which boots and serves; the API answers all along.
    deadline = time.monotonic() + 60
    while True:
        assert not errors, errors
        assert gunicorn.proc.poll() is None, "the gunicorn master died"
        workers = _children(gunicorn.proc.pid)
        served = gunicorn.served_by()
        replacement = [p for p in workers - original if served[p] > 0]
        if victim not in workers and len(workers) == 2 and replacement:
            break
        assert time.monotonic() < deadline, (
            f"no replacement worker serving: workers {workers}, served {dict(served)}"
        )
        time.sleep(0.1)
    after_replacement = load.successes
    deadline = time.monotonic() + 60
    while load.successes < after_replacement + 30:
        assert not errors, errors
        assert time.monotonic() < deadline, f"the API stopped answering: {load.statuses}"
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors

    # HTTP answers: every one was what a client expects; never a 5xx, before or after the kill.
    assert not load.unexpected, load.unexpected[:5]
    assert not [s for s in load.statuses if s >= 500], load.statuses
    assert load.successes > before_kill
    served = gunicorn.served_by()
    assert served[victim] > 0 and served[replacement[0]] > 0, served
    print(
        f"\nkilled worker {victim} holding {held} request(s); dropped at the connection level "
        f"and retried: {dict(load.dropped) or 'none'}, answered on retry: "
        f"{dict(load.retried) or 'none'}; answered: {dict(load.statuses)}; "
        f"served per worker: {dict(served)}"
    )

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            attempts = conn.execute(
                text("SELECT id, student, status, score, max_score, submitted_at FROM attempts")
            ).all()
            responses = conn.execute(
                text("SELECT attempt_id, item_id, answer, points, times_answered FROM responses")
            ).all()
            keys = conn.execute(text("SELECT key FROM idempotency_keys")).scalars().all()
    finally:
        engine.dispose()

    # Every attempt the clients saw created is stored exactly once, and no other: a start that
    # died in flight and was retried with its key did not make a second one.
    ids = [r.id for r in attempts]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(load.attempts), set(ids) ^ set(load.attempts)
    assert {r.id: r.student for r in attempts} == load.attempts
    # Every write that got its answer is recorded once under its key; none twice.
    assert sorted(keys) == sorted(load.keys)

    # Nothing acknowledged lost, nothing applied twice, nothing half-written.
    stored = {(r.attempt_id, r.item_id): r for r in responses}
    assert len(stored) == len(responses), "an item answered twice in one attempt"
    assert set(stored) == set(load.answers)
    for key, (answer, points) in load.answers.items():
        r = stored[key]
        assert (r.answer, r.points, r.times_answered) == (answer, points, 1), (key, r)
    points_of = Counter[str]()
    for (aid, _item), r in stored.items():
        points_of[aid] += r.points
    for a in attempts:
        if a.status == "submitted":
            assert a.score is not None and a.submitted_at is not None, a
            assert a.score == points_of[a.id] and a.max_score == 2.0, a
        else:
            assert a.status == "in_progress", a
            assert a.score is None and a.submitted_at is None, a
    for aid, score in load.submitted.items():
        a = next(a for a in attempts if a.id == aid)
        assert a.status == "submitted" and a.score == score, a
    # Each client finished the attempt it was in: all of them are submitted.
    assert set(load.submitted) == set(load.attempts)
