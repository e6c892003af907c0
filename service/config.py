"""Configuration: built-in defaults, then the environment, then the dict given to ``create_app``.

Environment variables (all optional):

``DATABASE_URL``
    SQLAlchemy URL. ``postgresql://...`` URLs are rewritten to the psycopg 3 driver. Default: the
    SQLite file ``var/kgrade.sqlite3`` under the current directory (what ``make run`` uses).
``KGRADE_SECRET_KEY``
    Flask's secret key (nothing kgrade stores depends on it; tokens are hashed without it so
    that rotating it never locks anyone out).
``KGRADE_MAX_CONTENT_LENGTH``
    Largest accepted request body in bytes (default 2 MiB); bigger bodies get a JSON 413.
``KGRADE_IMPORT_BANK``
    ``0`` to skip importing the shipped item bank into the database at start-up.
``KGRADE_BASE_URL``
    The public URL of this service (``https://kgrade.example.edu``): LTI launch and login URLs
    are built from it. Default: the URL each request came in on.
``KGRADE_PROXY_FIX``
    How many proxies sit in front (their ``X-Forwarded-*`` headers are trusted): behind a TLS
    proxy set ``1``, so the app sees https and sets the session cookie ``SameSite=None; Secure;
    Partitioned`` as an LMS iframe needs.
``KGRADE_TASKS_EAGER``
    ``1`` to run the LMS-facing tasks (grade passback, roster) in the web process after each
    commit instead of sending them to the ``lti`` queue (tests; a set-up with no worker).
``KGRADE_SUBMISSION_RATE``
    Accepted submissions per student, ``N/SECONDS`` in a moving window (default ``6/60``);
    instructors are not limited. Beyond it: 429 with ``Retry-After``.
``KGRADE_SIGNIN_RATE``
    Failed sign-ins (``/signin``) per client address, ``N/SECONDS`` (default ``10/60``).
``KGRADE_RATE_LIMIT_STORAGE_URL``
    Where flask-limiter counts: default ``REDIS_URL`` (shared by every process and pod), or
    ``memory://`` when there is no Redis (``make run``: one process).
``KGRADE_RATE_LIMIT_KEY_PREFIX``
    Prefix of the limiter's Redis keys (default ``KGRADE_REDIS_KEYPREFIX`` + ``kgrade-rl:``).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

DEFAULT_SQLITE_PATH = Path("var") / "kgrade.sqlite3"


def default_database_url() -> str:
    return f"sqlite:///{DEFAULT_SQLITE_PATH.resolve()}"


def normalize_database_url(url: str) -> str:
    """Point bare ``postgres(ql)://`` URLs at psycopg 3, the driver kgrade ships with.

    SQLAlchemy would otherwise pick psycopg2, which is not installed.
    """
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


DEFAULTS: dict[str, Any] = {
    "DATABASE_URL": None,  # resolved in load_config so the cwd is read at start-up, not import
    "SECRET_KEY": None,
    "MAX_CONTENT_LENGTH": 2 * 1024 * 1024,
    "IMPORT_BANK": True,
    "BASE_URL": None,
    "PROXY_FIX": 0,
    "TASKS_EAGER": False,
    # Rate limits (service.extensions.rate_limits); None: the environment, then the default.
    "SUBMISSION_RATE": None,
    "SIGNIN_RATE": None,
    "RATE_LIMIT_STORAGE_URL": None,
    "RATE_LIMIT_KEY_PREFIX": None,
    # Largest JSON body flask-smorest accepts is bounded by MAX_CONTENT_LENGTH; these are
    # flask-smorest / apispec settings for the OpenAPI document.
    "API_TITLE": "kgrade",
    "API_VERSION": "v1",
    "OPENAPI_VERSION": "3.0.3",
    "OPENAPI_URL_PREFIX": "/api/v1",
    "OPENAPI_JSON_PATH": "openapi.json",
    "API_SPEC_OPTIONS": {
        "info": {
            "description": (
                "Quiz delivery and grading for the long-context attention course. "
                "Authenticate with `Authorization: Bearer <token>` (create tokens with "
                "`kgrade token create --role instructor|student --name NAME`). "
                "Every error is a JSON object `{code, status, message, errors}`."
            )
        },
        "components": {
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "description": "kgrade token"}
            }
        },
    },
    # Keep key order in JSON bodies as the schemas declare it (readable curl output).
    "JSON_SORT_KEYS": False,
}


def _env_bool(value: str) -> bool:
    return value.strip().lower() not in ("0", "false", "no", "off", "")


def load_config(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Defaults, then environment variables, then ``overrides`` (tests pass theirs here)."""
    cfg = dict(DEFAULTS)
    env = os.environ
    if env.get("DATABASE_URL"):
        cfg["DATABASE_URL"] = env["DATABASE_URL"]
    if env.get("KGRADE_SECRET_KEY"):
        cfg["SECRET_KEY"] = env["KGRADE_SECRET_KEY"]
    if env.get("KGRADE_MAX_CONTENT_LENGTH"):
        cfg["MAX_CONTENT_LENGTH"] = int(env["KGRADE_MAX_CONTENT_LENGTH"])
    if env.get("KGRADE_IMPORT_BANK") is not None:
        cfg["IMPORT_BANK"] = _env_bool(env["KGRADE_IMPORT_BANK"])
    if env.get("KGRADE_BASE_URL"):
        cfg["BASE_URL"] = env["KGRADE_BASE_URL"].rstrip("/")
    if env.get("KGRADE_PROXY_FIX"):
        cfg["PROXY_FIX"] = int(env["KGRADE_PROXY_FIX"])
    if env.get("KGRADE_TASKS_EAGER") is not None:
        cfg["TASKS_EAGER"] = _env_bool(env["KGRADE_TASKS_EAGER"])
    for key in (
        "SUBMISSION_RATE",
        "SIGNIN_RATE",
        "RATE_LIMIT_STORAGE_URL",
        "RATE_LIMIT_KEY_PREFIX",
    ):
        if env.get(f"KGRADE_{key}"):
            cfg[key] = env[f"KGRADE_{key}"]
    cfg.update(overrides or {})
    cfg["DATABASE_URL"] = normalize_database_url(cfg["DATABASE_URL"] or default_database_url())
    if not cfg["SECRET_KEY"]:
        # Only signs Flask's session cookie, which the API never uses; a per-process value is
        # fine and avoids shipping a fixed secret.
        cfg["SECRET_KEY"] = secrets.token_hex(32)
    return cfg
