"""Celery worker processes for real: the no-server transport behind ``make run``, and a worker
killed mid-job (late acks + reject on worker lost: the job is redelivered, counted, finished).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port as _free_port
from tests.conftest import stop_group
from tests.workers.conftest import add_queued_submission
from tests.workers.faults_support import wait_for as _wait_for
from workers import store as st
from workers.exercises import load_exercise
from workers.queues import worker_argv
from workers.verdicts import Verdict

ROOT = Path(__file__).resolve().parents[2]
EXERCISE = "attention-merge"


def _correct_source() -> str:
    sol = next(s for s in load_exercise(EXERCISE).solutions() if s.expected is Verdict.PASS)
    return sol.path.read_text()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(extra)
    return env


def _stop(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    stop_group(proc, timeout)


def _job_processes(marker: str) -> list[int]:
    """Grader job processes (``python -m workers.job``) started under our var dir."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
            env = (p / "environ").read_bytes() if b"workers.job" in cmd else b""
        except OSError:
            continue
        if marker.encode() in env:
            pids.append(int(p.name))
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# --- make run: kgrade serve starts its own worker on the filesystem:// transport ------------


def _http(method: str, url: str, token: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, json.loads(resp.read())


@pytest.mark.slow
def test_make_run_grades_without_a_broker_server(tmp_path: Path) -> None:
    kgrade = [sys.executable, "-c", "import sys; from service.cli import main; sys.exit(main())"]
    env = _env(KGRADE_VAR_DIR=str(tmp_path / "var"), KGRADE_IMPORT_BANK="0")
    run = dict(cwd=tmp_path, env=env, check=True, capture_output=True, timeout=120)
    subprocess.run([*kgrade, "db", "upgrade", "--no-import"], **run)  # type: ignore[call-overload]
    token = (
        subprocess.run(  # type: ignore[call-overload]
            [*kgrade, "token", "create", "--role", "student", "--name", "ada"], **run
        )
        .stdout.decode()
        .strip()
        .splitlines()[-1]
    )
    port = _free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        serve = subprocess.Popen(
            [*kgrade, "serve", "--no-migrate", "--port", str(port), "--workers", "1"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}/api/v1"
    try:

        def up() -> bool:
            try:
                return _http("GET", f"{base}/whoami", token)[0] == 200
            except OSError:
                return False

        _wait_for("the API", up, 60, log)
        _wait_for("the embedded worker", lambda: b" ready." in log.read_bytes(), 60, log)
        status, body = _http(
            "POST", f"{base}/exercises/{EXERCISE}/submissions", token, {"source": _correct_source()}
        )
        assert status == 202 and body["queue"] == "cpu"

        def graded() -> dict[str, Any] | None:
            got = _http("GET", f"http://127.0.0.1:{port}{body['url']}", token)[1]
            return got if got["status"] == "done" else None

        got = _wait_for("the grade", graded, 90, log)
        assert got["verdict"] == "PASS", got["result"]["output"]
        # No server: the queue lived in files under var/, the results in SQLite.
        assert (tmp_path / "var" / "celery" / "queue").is_dir()
        assert (tmp_path / "var" / "celery-results.sqlite3").is_file()
        assert (tmp_path / "var" / "kgrade.sqlite3").is_file()
    finally:
        _stop(serve)
    # Stopping `kgrade serve` stops its worker too.
    assert serve.returncode is not None
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if (
                    b"embedded@" in (p / "cmdline").read_bytes()
                    and (p / "cwd").resolve() == tmp_path
                ):
                    pytest.fail(f"embedded worker {p.name} outlived kgrade serve")
            except OSError:
                continue


# --- a worker killed mid-job --------------------------------------------------------------


@pytest.fixture()
def sqlite_store(tmp_path: Path) -> st.SubmissionStore:
    s = st.SubmissionStore(f"sqlite:///{tmp_path / 'kgrade.sqlite3'}")
    st._metadata.create_all(s.engine)
    return s


def _add_submission(s: st.SubmissionStore, source: str) -> int:
    return add_queued_submission(s, source, exercise_id=EXERCISE)


@pytest.fixture()
def redis_worker(
    redis_url: str, sqlite_store: st.SubmissionStore, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path, dict[str, str]]]:
    prefix = f"kgt-{os.getpid()}-{uuid.uuid4().hex[:8]}:"
    env = _env(
        REDIS_URL=redis_url,
        KGRADE_REDIS_KEYPREFIX=prefix,
        DATABASE_URL=str(sqlite_store.engine.url),
        KGRADE_VAR_DIR=str(tmp_path / "var"),
    )
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            worker_argv(["cpu"], f"loss-{uuid.uuid4().hex[:6]}@%h"),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for("the worker", lambda: b" ready." in log.read_bytes(), 60, log)
        yield proc, log, env
    finally:
        _stop(proc)


def _pool_children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(p.name))
    return out


@pytest.mark.redis
@pytest.mark.slow
def test_worker_lost_mid_job_is_redelivered_and_counted(
    redis_worker: tuple[subprocess.Popen[bytes], Path, dict[str, str]],
    sqlite_store: st.SubmissionStore,
    tmp_path: Path,
) -> None:
    proc, log, env = redis_worker
    sid = _add_submission(sqlite_store, _correct_source())
    # Enqueue from a separate process with the worker's settings (this process's Celery app
    # may point elsewhere).
    send = (
        "import sys; from workers.tasks import grade_submission; "
        "grade_submission.apply_async(args=[int(sys.argv[1])], queue='cpu')"
    )
    subprocess.run(
        [sys.executable, "-c", send, str(sid)], cwd=ROOT, env=env, check=True, timeout=60
    )
    marker = str(tmp_path / "var")
    first = _wait_for("the job to start", lambda: _job_processes(marker), 60, log)
    (child,) = _pool_children(proc.pid)
    os.kill(child, signal.SIGKILL)  # the pool process dies mid-job, without any clean-up
    # The first job process goes down with it (PR_SET_PDEATHSIG), the task comes back.
    _wait_for("the orphaned job to die", lambda: not any(map(_alive, first)), 3, log)
    sub = _wait_for(
        "the redelivered grade",
        lambda: (s := sqlite_store.get(sid)) is not None and s.status == st.DONE and s,
        120,
        log,
    )
    assert sub.verdict == "PASS" and sub.attempts == 2
    assert [r["attempt"] for r in sqlite_store.results(sid)] == [2]
    assert "WorkerLostError" in log.read_text() or "signal 9" in log.read_text()
    _wait_for("no job process left", lambda: not _job_processes(marker), 15, log)
