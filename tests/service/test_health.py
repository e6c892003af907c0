"""/healthz and /readyz against the real PostgreSQL and Redis, and against ports nobody serves."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from service import create_app


def _dead_port() -> int:
    """A local port with nothing listening: connecting to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client(database_url: str, redis_url: str | None) -> FlaskClient:
    config: dict[str, Any] = {
        "DATABASE_URL": database_url,
        "IMPORT_BANK": False,
        # "" and None both mean: no broker configured (the embedded transport).
        "REDIS_URL": redis_url or "",
        "TESTING": True,
    }
    return create_app(config).test_client()


@pytest.fixture
def dead_postgres() -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:{_dead_port()}/kgrade"


@pytest.fixture
def dead_redis() -> str:
    return f"redis://127.0.0.1:{_dead_port()}/0"


def test_ready_with_real_postgres_and_redis(postgres_url: str, redis_url: str) -> None:
    res = _client(postgres_url, redis_url).get("/readyz")
    assert res.status_code == 200, res.get_json()
    body = res.get_json()
    assert body["status"] == "ready"
    assert body["checks"]["database"] == {"ok": True}
    assert body["checks"]["broker"] == {"ok": True, "detail": "redis"}
    assert res.headers["Cache-Control"] == "no-store"


def test_ready_on_sqlite_without_a_broker(tmp_path: Path) -> None:
    """`make run`: SQLite and the embedded transport; no broker server is not a failure."""
    res = _client(f"sqlite:///{tmp_path / 'k.sqlite3'}", None).get("/readyz")
    assert res.status_code == 200, res.get_json()
    assert res.get_json()["checks"]["broker"]["ok"] is True
    assert "not configured" in res.get_json()["checks"]["broker"]["detail"]


def test_unreachable_broker_is_503_naming_it(postgres_url: str, dead_redis: str) -> None:
    res = _client(postgres_url, dead_redis).get("/readyz")
    assert res.status_code == 503
    assert res.is_json
    body = res.get_json()
    assert body["status"] == "unavailable"
    assert body["unreachable"] == ["broker"]
    assert body["checks"]["database"] == {"ok": True}
    assert body["checks"]["broker"]["ok"] is False
    assert body["checks"]["broker"]["error"]  # the exception's type, e.g. ConnectionError
    assert int(res.headers["Retry-After"]) > 0
    # No host or port in an unauthenticated answer.
    assert "127.0.0.1" not in res.get_data(as_text=True)


def test_unreachable_database_is_503_naming_it(dead_postgres: str, redis_url: str) -> None:
    res = _client(dead_postgres, redis_url).get("/readyz")
    assert res.status_code == 503
    body = res.get_json()
    assert body["unreachable"] == ["database"]
    assert body["checks"]["broker"]["ok"] is True
    assert "127.0.0.1" not in res.get_data(as_text=True)


def test_both_down_names_both_and_liveness_stays_up(dead_postgres: str, dead_redis: str) -> None:
    client = _client(dead_postgres, dead_redis)
    res = client.get("/readyz")
    assert res.status_code == 503
    assert sorted(res.get_json()["unreachable"]) == ["broker", "database"]
    # Liveness never depends on the dependencies: an outage must not restart every API pod.
    live = client.get("/healthz")
    assert live.status_code == 200
    assert live.get_json() == {"status": "ok"}


def test_probes_need_no_token_and_answer_json(postgres_url: str, redis_url: str) -> None:
    client = _client(postgres_url, redis_url)
    for path in ("/healthz", "/readyz"):
        res = client.get(path)  # no Authorization header
        assert res.status_code == 200, path
        assert res.mimetype == "application/json", path
