"""Suite-wide fixtures: the real servers that `make test` starts, and repo paths.

`make test` sets KGRADE_REQUIRE_SERVICES=1, so a missing PostgreSQL, Redis or Chromium fails
the run there instead of skipping quietly; a bare `pytest` on a laptop skips those tests.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SESSION_VAR_PREFIX = "kgrade-test-var-"

# The server-less Celery state (the filesystem broker's queue, its results, the reference
# caches: ``workers.celery_app.var_dir``) of every test goes to a folder of this session, not
# the checkout's ./var that `make run` serves from: the LTI tests that keep a task queued left
# grade and passback messages in ./var/celery/queue, and the next `make run` worker ran them
# against the developer's own database. Module code, not pytest_configure: the conftests
# below this one are imported before that hook and some load the Celery app, which reads the
# folder once. Only the path is set here; Celery makes the folders it uses, so a subprocess
# that imports this module (for ``free_port``) makes none. A subprocess of the session keeps
# its folder; a test that needs one of its own still sets KGRADE_VAR_DIR itself.
SESSION_VAR = Path(os.environ.get("KGRADE_VAR_DIR") or "/")
_OWN_VAR = not SESSION_VAR.name.startswith(SESSION_VAR_PREFIX)  # not a session's subprocess
if _OWN_VAR:
    SESSION_VAR = Path(tempfile.gettempdir()) / f"{SESSION_VAR_PREFIX}{os.getpid()}"
    shutil.rmtree(SESSION_VAR, ignore_errors=True)  # an earlier session's, by the same pid
    os.environ["KGRADE_VAR_DIR"] = str(SESSION_VAR)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OWN_VAR:
        shutil.rmtree(SESSION_VAR, ignore_errors=True)


def free_port() -> int:
    """A TCP port nobody listens on now (for a server a test starts itself)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_group(proc: subprocess.Popen[Any], timeout: float = 30) -> None:
    """Stop a server a test started in its own session (``start_new_session=True``): SIGTERM
    to its whole process group, then SIGKILL if it is not gone within ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


SHARED = ROOT.parent / "shared"
SCHEMAS = SHARED / "schemas"


def _service(var: str, what: str) -> str:
    value = os.environ.get(var)
    if value:
        return value
    if os.environ.get("KGRADE_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{what} is required here but {var} is not set (make test starts it)")
    pytest.skip(f"{what} not available: run through `make test` (sets {var})")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    return _service("KGRADE_TEST_DATABASE_URL", "PostgreSQL")


@pytest.fixture(scope="session")
def redis_url() -> str:
    return _service("KGRADE_TEST_REDIS_URL", "Redis")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = os.environ.get("KGRADE_CHROMIUM") or shutil.which("chromium")
    if path:
        return path
    return _service("KGRADE_CHROMIUM", "Chromium")


@pytest.fixture(scope="session")
def schemas_dir() -> Path:
    if not SCHEMAS.is_dir():
        pytest.fail(f"the official schemas are expected at {SCHEMAS}")
    return SCHEMAS
