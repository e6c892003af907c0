"""Redis restarted (AOF on) while jobs are running and queued: every job completes, each graded
to the end exactly once (real worker, our own redis-server on a free port, PostgreSQL).

On a broker connection loss Celery cancels the running job
(``worker_cancel_long_running_tasks_on_connection_loss``) and acknowledges its message as
revoked once it reconnects, so nothing is left to redeliver: the row's heartbeat stops and the
beat reaper requeues it. The queued messages survive in the append-only file.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port as _free_port
from tests.workers.faults_support import (
    Worker,
    add_job,
    pg_store,
    row,
    send,
    sender,
    stub_lines,
    wait_for,
    worker_env,
)
from workers import store as st

pytestmark = [pytest.mark.redis, pytest.mark.slow]


class OwnRedis:
    """A redis-server of this test only, with AOF on, restartable on the same port and files."""

    def __init__(self, folder: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is required (make test installs it)")
        self.port = _free_port()
        self.folder = folder
        self.argv = [
            exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(folder),
            "--appendonly", "yes", "--save", "", "--maxmemory-policy", "noeviction",
        ]  # fmt: skip
        self.log = folder / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        wait_for("redis", self._up, 20, self.log)

    def _up(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: Redis flushes the AOF and exits
            self.proc.wait(timeout=20)


@pytest.fixture()
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    folder = tmp_path / "redis"
    folder.mkdir()
    r = OwnRedis(folder)
    r.start()
    try:
        yield r
    finally:
        r.stop()


def test_redis_restart_loses_no_running_or_queued_job(
    own_redis: OwnRedis, postgres_url: str, tmp_path: Path
) -> None:
    with pg_store(postgres_url) as store:
        env = worker_env(
            tmp_path, own_redis.url, store.engine.url.render_as_string(hide_password=False)
        )
        stub_log = tmp_path / "stub.log"
        # One runs through the restart; two wait in the queue behind it (one worker, -c 1).
        jobs = [add_job(store, name) for name in ("stub-r1-sleep4", "stub-r2", "stub-r3")]
        app = sender(own_redis.url, env)
        worker = Worker(env, tmp_path, beat=True)
        try:
            for sid, task_id in jobs:
                send(app, sid, task_id)
            wait_for(
                "the first grading",
                lambda: stub_lines(stub_log, "start", "stub-r1-sleep4"),
                30,
                worker.log,
            )
            assert row(store, jobs[0][0]).status == st.RUNNING
            own_redis.stop()
            time.sleep(1.0)
            own_redis.start()

            def all_done() -> bool:
                return all(row(store, sid).status == st.DONE for sid, _ in jobs)

            wait_for("every job", all_done, 60, worker.log)
        finally:
            worker.stop()
        for (sid, _), name in zip(jobs, ("stub-r1-sleep4", "stub-r2", "stub-r3"), strict=True):
            done = row(store, sid)
            assert done.verdict == "PASS", (name, done)
            assert len(store.results(sid)) == 1, name  # one final result, no second grade
            assert stub_lines(stub_log, "done", name) == 1, name
        log = worker.log.read_text()
        # The connection loss really hit the running job (else this test proves nothing).
        assert "connection" in log.lower()
