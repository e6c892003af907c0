"""Health endpoints for process supervisors (docker compose, Kubernetes probes).

``/healthz`` answers as long as the process serves requests: a liveness probe restarts the
container only when the process itself is stuck, never because a dependency is down (a
PostgreSQL outage would otherwise restart every API pod at once, which cures nothing).

``/readyz`` checks what a request needs: the database answers ``SELECT 1`` and the Celery
broker (Redis) answers ``PING``. Without ``REDIS_URL`` kgrade uses its embedded filesystem
transport (``make run``), which has no server to be down, so "not configured" is ready. An
unreachable dependency gives 503 naming it; the answer carries only the exception's type, not
its message, since these endpoints have no authentication and a driver's message names hosts.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from flask import Blueprint, Flask, current_app, jsonify
from flask.typing import ResponseReturnValue
from sqlalchemy import text

log = logging.getLogger(__name__)

bp = Blueprint("health", __name__)

#: Seconds a Redis connect or reply may take before the broker counts as unreachable; well
#: below the probes' own timeouts, so the probe gets our JSON rather than its own timeout.
BROKER_TIMEOUT_S = 2.0
#: What a client (or a person reading the 503) should wait before asking again.
RETRY_AFTER_S = 5


def _check_database() -> dict[str, Any]:
    from service.extensions import db

    with db.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    return {"ok": True}


def broker_url(app: Flask) -> str | None:
    """The Redis URL the Celery app uses: ``REDIS_URL`` (the app config may override it, as
    tests do), or None for the embedded transport."""
    url = app.config.get("REDIS_URL", os.environ.get("REDIS_URL"))
    return url or None


def _check_broker() -> dict[str, Any]:
    url = broker_url(current_app)
    if url is None:
        return {"ok": True, "detail": "not configured (embedded filesystem transport)"}
    import redis

    client = redis.Redis.from_url(
        url, socket_connect_timeout=BROKER_TIMEOUT_S, socket_timeout=BROKER_TIMEOUT_S
    )
    try:
        client.ping()
    finally:
        client.close()
    return {"ok": True, "detail": "redis"}


CHECKS = {"database": _check_database, "broker": _check_broker}


def _no_store(response: Any) -> Any:
    # A cached "ready" from a proxy would hide an outage.
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    return _no_store(jsonify(status="ok"))


@bp.get("/readyz")
def readyz() -> ResponseReturnValue:
    checks: dict[str, dict[str, Any]] = {}
    for name, check in CHECKS.items():
        try:
            checks[name] = check()
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready", named below
            log.warning("readiness: %s unreachable: %s", name, exc)
            checks[name] = {"ok": False, "error": type(exc).__name__}
    unreachable = [name for name, result in checks.items() if not result["ok"]]
    if not unreachable:
        return _no_store(jsonify(status="ready", checks=checks))
    response = jsonify(status="unavailable", unreachable=unreachable, checks=checks)
    response.status_code = 503
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return _no_store(response)


def register_health(app: Flask) -> None:
    app.register_blueprint(bp)
