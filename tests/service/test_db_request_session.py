"""The request's session (service.db.request): Core statements and the ORM in one transaction,
with no ORM session made for the quiz flow."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.core import tasks
from service.db import write_intent
from service.db.base import utcnow
from service.db.courses import Course
from service.db.prepared import Prepared
from service.db.request import RequestSession, orm_session
from service.extensions import db
from tests.service.conftest import World

_INSERT = Prepared(Course.__table__.insert(), column_keys=("slug", "title", "created_at"))


def _insert(sess: Session, slug: str) -> None:
    _INSERT.execute(sess.connection(), {"slug": slug, "title": slug, "created_at": utcnow()})


def _count(session: Session, slug: str) -> int:
    """Rows of ``slug`` as another connection sees them (its transaction ended at once: with
    the test's write intent it holds SQLite's writer lock)."""
    try:
        return int(session.execute(select(func.count()).where(Course.slug == slug)).scalar_one())
    finally:
        session.rollback()


@pytest.fixture
def req(app: Flask) -> Iterator[RequestSession]:
    with app.app_context(), write_intent():
        sess = db.session
        assert isinstance(sess, RequestSession)
        yield sess


def test_core_only_makes_no_orm_session(req: RequestSession, session: Session) -> None:
    _insert(req, "core-only")  # type: ignore[arg-type]
    assert req.in_transaction()
    req.commit()
    assert not req.in_transaction()
    assert req._orm is None
    assert _count(session, "core-only") == 1


def test_core_then_orm_is_one_transaction(req: RequestSession, session: Session) -> None:
    _insert(req, "core-first")  # type: ignore[arg-type]
    req.add(Course(slug="orm-second", title="t"))  # makes the ORM session: it joins
    req.flush()
    req.rollback()
    assert _count(session, "core-first") == 0 and _count(session, "orm-second") == 0
    _insert(req, "core-again")  # type: ignore[arg-type]
    req.add(Course(slug="orm-again", title="t"))
    req.commit()
    assert _count(session, "core-again") == 1 and _count(session, "orm-again") == 1


def test_connection_kept_across_a_commit(req: RequestSession, session: Session) -> None:
    """A transaction begun on the connection behind the ORM session's back (a connection taken
    before its last commit) is still the one its commit commits."""
    req.add(Course(slug="first", title="t"))
    conn = req.connection()
    req.commit()
    _INSERT.execute(
        conn, {"slug": "after", "title": "t", "created_at": utcnow()}
    )  # begins on the connection itself
    req.commit()
    assert _count(session, "after") == 1


def test_after_commit_waits_for_the_commit(req: RequestSession, session: Session) -> None:
    seen: list[int] = []
    _insert(req, "evented")  # type: ignore[arg-type]
    tasks.after_commit(req, lambda: seen.append(_count(session, "evented")))  # type: ignore[arg-type]
    assert seen == []
    req.commit()
    assert seen == [1]  # sent once the row was there for others to see

    _insert(req, "rolled-back")  # type: ignore[arg-type]
    tasks.after_commit(req, lambda: seen.append(-1))  # type: ignore[arg-type]
    req.rollback()
    req.commit()
    assert seen == [1] and _count(session, "rolled-back") == 0


def test_close_rolls_back_and_can_go_on(req: RequestSession, session: Session) -> None:
    _insert(req, "unsaved")  # type: ignore[arg-type]
    first = req.get_transaction()
    assert first is not None
    req.close()
    assert req.get_transaction() is None and not req.in_transaction()
    _insert(req, "saved")  # type: ignore[arg-type]
    assert req.get_transaction() is not first
    req.commit()
    assert _count(session, "unsaved") == 0 and _count(session, "saved") == 1


def test_bind_is_the_engine(req: RequestSession, app: Flask) -> None:
    req.add(Course(slug="bound", title="t"))
    assert req.get_bind() is app.extensions["kgrade.db"][0]
    assert orm_session(req) is req.orm and isinstance(req.orm, Session)
    assert req.new  # the ORM's pending objects
    req.rollback()


def test_quiz_flow_uses_no_orm_session(
    world: World, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Start (the quiz in the cache), answer and submit run on the connection alone."""
    attempt = world.start("quiz-a")  # the first start loads the quiz through the ORM
    made: list[Any] = []
    real = RequestSession.orm

    def spy(self: RequestSession) -> Session:
        made.append(self)
        return real.fget(self)  # type: ignore[attr-defined,no-any-return]

    monkeypatch.setattr(RequestSession, "orm", property(spy))
    assert world.answer(attempt["id"], "q1", ["b"]).status_code == 201
    assert world.submit(attempt["id"]).status_code == 200
    assert world.start("quiz-a")["number"] == 2
    assert made == []
