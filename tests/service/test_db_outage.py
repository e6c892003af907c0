"""PostgreSQL restarted while students take quizzes: 503 with Retry-After (never a 500), the API
recovers by itself, and no attempt is left half-written or lost.

The test runs its OWN PostgreSQL cluster (initdb in a temporary folder, a free port), never the
shared one of ``make services``, and stops it with ``pg_ctl -m fast`` (which ends every session
mid-transaction, as a restart or failover does) while client threads run quiz attempts.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import create_engine, text

from item_bank import load_quiz
from service import create_app
from service.db import Base, load_models, write_intent
from tests.conftest import free_port as _free_port
from tests.service.conftest import QUIZ_B

RESTART_DOWN_S = 2.0


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


class OwnPostgres:
    """A throwaway cluster; as root the server runs as the ``postgres`` user, as it must."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="kgrade-pg-outage-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")

    def _run(self, *argv: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=60)

    def init(self) -> None:
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
            "-E", "UTF8", "--no-locale",
        )  # fmt: skip

    def start(self) -> None:
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-l", str(self.root / "log"),
            "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )  # fmt: skip

    def stop(self) -> None:
        # -m fast: every session is terminated mid-transaction, as in a restart or failover.
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def own_pg() -> Iterator[OwnPostgres]:
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.fail("PostgreSQL server binaries missing: apt-get install postgresql (make test)")
    pg = OwnPostgres(bin_dir)
    try:
        pg.init()
        pg.start()
        yield pg
    finally:
        pg.remove()


@pytest.fixture(scope="module")
def outage_app(own_pg: OwnPostgres) -> tuple[Flask, dict[str, str]]:
    from service.auth import create_token
    from service.extensions import db
    from service.quizzes_store import create_quiz

    load_models()
    engine = create_engine(own_pg.url)
    Base.metadata.create_all(engine)
    engine.dispose()
    app = create_app({"DATABASE_URL": own_pg.url, "IMPORT_BANK": False})
    tokens = {}
    with app.app_context(), write_intent():
        for name in ("s1", "s2", "s3", "s4"):
            tokens[name] = create_token(db.session, role="student", name=name)[1]
        create_quiz(db.session, load_quiz(copy.deepcopy(QUIZ_B)))
        db.session.commit()
    return app, tokens


@dataclass
class Load:
    """What the client threads saw: statuses, the attempts the API acknowledged."""

    statuses: Counter[int] = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)
    started: set[str] = field(default_factory=set)
    submitted: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, r: Any, what: str) -> None:
        with self.lock:
            self.statuses[r.status_code] += 1
            if r.status_code >= 500 and (
                r.status_code != 503
                or not r.headers.get("Retry-After", "").isdigit()
                or not (r.is_json and r.get_json().get("code") == 503)
            ):
                self.bad.append(f"{what}: {r.status_code} {r.headers} {r.data[:200]!r}")


def _student_loop(app: Flask, token: str, load: Load, stop: threading.Event) -> None:
    client = app.test_client()
    h = {"Authorization": f"Bearer {token}"}
    while not stop.is_set():
        r = client.post("/api/v1/quizzes/quiz-b/attempts", headers=h, json={"lang": "en"})
        load.record(r, "start")
        if r.status_code != 201:
            time.sleep(0.05)
            continue
        aid = r.get_json()["id"]
        with load.lock:
            load.started.add(aid)
        for item, option in (("x1", "two"), ("x2", "five")):
            r = client.post(
                f"/api/v1/attempts/{aid}/responses",
                headers=h,
                json={"item_id": item, "answer": [option]},
            )
            load.record(r, "answer")
        # Retry the submit through the outage with one key, as a careful client would.
        key = {"Idempotency-Key": f"submit-{aid}"}
        for _ in range(100):
            r = client.post(f"/api/v1/attempts/{aid}/submit", headers={**h, **key})
            load.record(r, "submit")
            if r.status_code == 200:
                with load.lock:
                    load.submitted[aid] = r.get_json()["score"]
                break
            time.sleep(0.1)


def test_postgres_restart_under_quiz_load(
    own_pg: OwnPostgres, outage_app: tuple[Flask, dict[str, str]]
) -> None:
    app, tokens = outage_app
    load = Load()
    stop = threading.Event()
    threads = [
        threading.Thread(target=_student_loop, args=(app, t, load, stop), daemon=True)
        for t in tokens.values()
    ]
    for t in threads:
        t.start()
    time.sleep(1.0)
    before = sum(load.statuses[c] for c in (200, 201))
    assert before > 0, f"no traffic before the restart: {load.statuses}"
    own_pg.stop()
    time.sleep(RESTART_DOWN_S)
    own_pg.start()
    # Recovery by itself: successes again within a few seconds, with no help from the test.
    deadline = time.monotonic() + 15
    after_restart = sum(load.statuses[c] for c in (200, 201))
    while sum(load.statuses[c] for c in (200, 201)) < after_restart + 20:
        assert time.monotonic() < deadline, f"API did not recover: {load.statuses}"
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)

    assert not load.bad, "\n".join(load.bad[:5])
    assert load.statuses[503] > 0, f"the outage was never met: {load.statuses}"
    assert load.statuses[500] == 0

    engine = create_engine(own_pg.url)
    try:
        with engine.connect() as conn:
            rows = {
                r.id: r
                for r in conn.execute(
                    text("SELECT id, status, score, submitted_at FROM attempts")
                ).all()
            }
            responses = conn.execute(
                text(
                    "SELECT attempt_id, count(*) FROM responses GROUP BY attempt_id "
                    "HAVING count(*) > 2"
                )
            ).all()
    finally:
        engine.dispose()
    # Nothing acknowledged was lost.
    assert load.started <= set(rows), load.started - set(rows)
    for aid, score in load.submitted.items():
        assert rows[aid].status == "submitted" and rows[aid].score == score, rows[aid]
    # Nothing half-written: a submitted attempt has its score and time, an open one neither.
    for r in rows.values():
        if r.status == "submitted":
            assert r.score is not None and r.submitted_at is not None, r
        else:
            assert r.score is None and r.submitted_at is None, r
    assert not responses, responses
