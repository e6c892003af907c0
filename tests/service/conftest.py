"""Fixtures for the API and persistence tests, run against SQLite and PostgreSQL alike.

``backend`` is parametrized over both databases; each backend gets one app for the session
(tables made with ``create_all``; the migrations have their own tests) and every test starts
from empty tables. PostgreSQL tests run in a schema of their own so parallel runs and other
suites sharing the server never see each other's rows.
"""

from __future__ import annotations

import copy
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import create_engine, delete, text
from sqlalchemy.orm import Session

from item_bank import load_quiz
from service import create_app
from service.db import Base, load_models, write_intent
from tests.conftest import stop_group


def _t(lang: str, text_: str, **tr: str) -> dict[str, str]:
    return {"lang": lang, "text": text_, **tr}


def _opt(oid: str, en: str, correct: bool, fb: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": oid, "text": _t("en", en), "correct": correct}
    if fb is not None:
        out["feedback"] = _t("en", fb, el=f"[el] {fb}")
    return out


#: Three item types, a Greek source language, two attempts, no re-answering.
QUIZ_A: dict[str, Any] = {
    "id": "quiz-a",
    "title": _t("el", "Κουίζ Α", en="Quiz A"),
    "description": _t("el", "Περιγραφή", en="Description A"),
    "source_lang": "el",
    "settings": {"allowed_attempts": 2, "allow_reanswer": False},
    "items": [
        {
            "id": "q1",
            "type": "multiple_choice",
            "points": 2,
            "topics": ["basics"],
            "prompt": _t("el", "Ερώτηση ένα", en="Question one"),
            "options": [
                _opt("a", "Alpha", False, "A is wrong"),
                _opt("b", "Bravo", True, "B is right"),
                _opt("c", "Charlie", False, "C is wrong"),
            ],
            "explanation": _t("en", "Because B.", el="Επειδή B."),
        },
        {
            "id": "q2",
            "type": "multiple_answers",
            "points": 3,
            "topics": ["basics"],
            "prompt": _t("en", "Pick the even numbers", el="Διάλεξε τους άρτιους"),
            "options": [
                _opt("n2", "2", True, "2 is even"),
                _opt("n3", "3", False, "3 is odd"),
                _opt("n4", "4", True, "4 is even"),
                _opt("n5", "5", False, "5 is odd"),
                _opt("n6", "6", True, "6 is even"),
            ],
            "explanation": _t("en", "Even numbers divide by 2.", el="Οι άρτιοι διαιρούνται."),
        },
        {
            "id": "q3",
            "type": "true_false",
            "points": 1,
            "topics": ["basics"],
            "prompt": _t("en", "The sky is green.", el="Ο ουρανός είναι πράσινος."),
            "options": [
                _opt("t", "True", False, "It is blue"),
                _opt("f", "False", True),
            ],
            "explanation": _t("en", "The sky is blue.", el="Ο ουρανός είναι μπλε."),
        },
    ],
}

#: Unlimited attempts and re-answering allowed.
QUIZ_B: dict[str, Any] = {
    "id": "quiz-b",
    "title": _t("en", "Quiz B"),
    "description": _t("en", "Description B"),
    "source_lang": "en",
    "settings": {"allowed_attempts": None, "allow_reanswer": True},
    "items": [
        {
            "id": "x1",
            "type": "multiple_choice",
            "points": 1,
            "topics": ["misc"],
            "prompt": _t("en", "One plus one?"),
            "options": [_opt("two", "2", True, "Yes"), _opt("three", "3", False, "No")],
            "explanation": _t("en", "Arithmetic."),
        },
        {
            "id": "x2",
            "type": "multiple_choice",
            "points": 1,
            "topics": ["misc"],
            "prompt": _t("en", "Two plus two?"),
            "options": [_opt("four", "4", True, "Yes"), _opt("five", "5", False, "No")],
            "explanation": _t("en", "More arithmetic."),
        },
    ],
}


def quiz_data(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(base)
    data.update(changes)
    return data


# ---- databases ---------------------------------------------------------------------------


def _pg_schema_url(base: str, schema: str) -> str:
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}"


@pytest.fixture(scope="session")
def pg_schema_factory(postgres_url: str) -> Iterator[Any]:
    """Make throwaway PostgreSQL schemas; drops them all at the end of the session."""
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    made: list[str] = []

    def make(prefix: str = "kgt") -> str:
        name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
        made.append(name)
        return _pg_schema_url(postgres_url, name)

    yield make
    with admin.connect() as conn:
        for name in made:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
    admin.dispose()


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The database URL of one backend, with kgrade's tables created."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'kgrade-test.sqlite3'}"
    else:
        url = request.getfixturevalue("pg_schema_factory")()
    load_models()
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
    return url


@pytest.fixture(scope="session")
def _apps() -> dict[str, Flask]:
    return {}


@pytest.fixture
def app(backend: str, _apps: dict[str, Flask]) -> Iterator[Flask]:
    """A kgrade app on ``backend`` whose tables are empty when the test starts."""
    app = _apps.get(backend)
    if app is None:
        app = create_app({"DATABASE_URL": backend, "IMPORT_BANK": False, "TESTING": True})
        _apps[backend] = app
    from service.extensions import db, rate_limits

    with app.app_context(), write_intent():
        sess = db.session
        for table in reversed(Base.metadata.sorted_tables):
            sess.execute(delete(table))
        sess.commit()
    rate_limits.reset(app)  # the app outlives the test: so would its rate-limit counts
    yield app


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def session(app: Flask) -> Iterator[Session]:
    """A session of its own (not the request's), for arranging and checking stored rows."""

    sess = Session(db_engine(app), expire_on_commit=False)
    try:
        yield sess
    finally:
        sess.close()


def db_engine(app: Flask) -> Any:
    return app.extensions["kgrade.db"][0]


# ---- people and quizzes -----------------------------------------------------------------


@dataclass
class World:
    client: FlaskClient
    app: Flask
    tokens: dict[str, str]

    def h(self, who: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}", **extra}

    def get(self, url: str, who: str, **kw: Any) -> Any:
        return self.client.get(url, headers=self.h(who, **kw.pop("headers", {})), **kw)

    def post(self, url: str, who: str, **kw: Any) -> Any:
        return self.client.post(url, headers=self.h(who, **kw.pop("headers", {})), **kw)

    def put(self, url: str, who: str, **kw: Any) -> Any:
        return self.client.put(url, headers=self.h(who, **kw.pop("headers", {})), **kw)

    def start(self, quiz_id: str, who: str = "alice", lang: str = "en") -> dict[str, Any]:
        r = self.post(f"/api/v1/quizzes/{quiz_id}/attempts", who, json={"lang": lang})
        assert r.status_code == 201, r.get_json()
        return r.get_json()

    def answer(self, attempt_id: str, item_id: str, answer: list[str], who: str = "alice") -> Any:
        return self.post(
            f"/api/v1/attempts/{attempt_id}/responses",
            who,
            json={"item_id": item_id, "answer": answer},
        )

    def submit(self, attempt_id: str, who: str = "alice") -> Any:
        return self.post(f"/api/v1/attempts/{attempt_id}/submit", who)


@pytest.fixture
def world(app: Flask, client: FlaskClient) -> World:
    """Tokens for an instructor (prof) and two students (alice, bob); quizzes A and B stored."""
    from service.auth import create_token
    from service.extensions import db
    from service.quizzes_store import create_quiz

    tokens: dict[str, str] = {}
    with app.app_context(), write_intent():
        sess = db.session
        for name, role in (("prof", "instructor"), ("alice", "student"), ("bob", "student")):
            tokens[name] = create_token(sess, role=role, name=name)[1]
        for data in (QUIZ_A, QUIZ_B):
            create_quiz(sess, load_quiz(copy.deepcopy(data)))
        sess.commit()
    return World(client=client, app=app, tokens=tokens)


def table_snapshot(app: Flask) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, to assert that a refused request changed nothing."""
    engine = db_engine(app)
    out: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            rows = conn.execute(table.select()).all()
            out[table.name] = sorted((tuple(map(repr, r)) for r in rows), key=repr)
    return out


REPO = Path(__file__).resolve().parents[2]


# ---- real Celery workers -----------------------------------------------------------------


@pytest.fixture(scope="module")
def celery_redis(redis_url: str) -> Iterator[dict[str, str]]:
    """Point this process's Celery app at the test Redis, under a key prefix of its own."""
    from workers import celery_app as ca

    prefix = f"kgt-{os.getpid()}-{secrets.token_hex(4)}:"
    old = os.environ.get("KGRADE_REDIS_KEYPREFIX")
    os.environ["KGRADE_REDIS_KEYPREFIX"] = prefix
    ca.app.conf.update(ca.broker_settings(redis_url))
    # A result backend or producer pool made earlier in this process (an eager task run builds
    # one) would keep the old settings: drop them so the next use reads the new ones.
    _fresh_connections(ca.app)
    yield {"REDIS_URL": redis_url, "KGRADE_REDIS_KEYPREFIX": prefix}
    if old is None:
        os.environ.pop("KGRADE_REDIS_KEYPREFIX", None)
    else:
        os.environ["KGRADE_REDIS_KEYPREFIX"] = old


def _fresh_connections(app: Any) -> None:
    """Drop the Celery app's result backend, connection pool and producer pool (and kombu's
    global pools), so the next send reads the new settings. Without the producer pool a second
    module would get kombu's 'Acquire on closed pool' from the first's closed connections."""
    import kombu.pools

    app._local.__dict__.pop("backend", None)
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None
    kombu.pools.reset()


@contextmanager
def running_worker(argv: list[str], env: dict[str, str], folder: Path) -> Iterator[Path]:
    """A Celery worker process until the block ends; its log file (once it said ready)."""
    log = folder / f"worker-{secrets.token_hex(3)}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        while b" ready." not in log.read_bytes():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "worker did not start:\n" + log.read_text()[-3000:]
            time.sleep(0.2)
        yield log
    finally:
        stop_group(proc)
