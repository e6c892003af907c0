"""An answer reads its attempt in its token lookup's statement (``auth.JoinedRead``,
``core.attempts.ANSWER_READ``): one statement fewer, with the token still checked first and
every refusal as before."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.db.attempts import ResponseRecord
from service.db.prepared import Prepared
from service.db.tokens import ApiToken
from tests.service.conftest import World


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL of every prepared statement the app runs (the quiz flow's only statements)."""
    seen: list[str] = []
    real = Prepared.execute

    def execute(self: Prepared, conn: Any, params: Any = None) -> Any:
        seen.append(self._plan(conn.dialect).sql)
        return real(self, conn, params)

    monkeypatch.setattr(Prepared, "execute", execute)
    return seen


def _kinds(sql: list[str]) -> list[str]:
    def kind(s: str) -> str:
        if s.startswith("INSERT INTO responses"):
            return "insert"
        if s.startswith("UPDATE responses"):
            return "replace"
        if "FROM api_tokens LEFT OUTER JOIN" in s:
            return "token+attempt"
        if s.startswith("SELECT") and "FROM api_tokens" in s:
            return "token"
        if "LEFT OUTER JOIN responses" in s:
            return "attempt+item"
        return s.split()[0]

    return [kind(s) for s in sql]


def _answer(world: World, aid: str, item: str, answer: list[str], who: str = "alice") -> Any:
    return world.answer(aid, item, answer, who=who)


def test_first_answer_is_two_statements(world: World, statements: list[str]) -> None:
    aid = world.start("quiz-a")["id"]
    statements.clear()
    r = _answer(world, aid, "q1", ["b"])
    assert r.status_code == 201 and r.get_json()["times_answered"] == 1
    assert _kinds(statements) == ["token+attempt", "insert"]


def test_answered_item_is_found_by_the_write(
    world: World, session: Session, statements: list[str]
) -> None:
    """The joined read does not know the item's answer: the insert finds it (nothing written),
    then the item is read and the answer refused (quiz A) or replaced (quiz B)."""
    aid = world.start("quiz-a")["id"]
    assert _answer(world, aid, "q1", ["b"]).status_code == 201
    statements.clear()
    r = _answer(world, aid, "q1", ["a"])
    assert r.status_code == 409 and "already answered" in r.get_json()["message"]
    assert _kinds(statements) == ["token+attempt", "insert", "attempt+item"]
    session.rollback()
    assert session.execute(select(ResponseRecord.answer)).scalars().all() == [["b"]]

    bid = world.start("quiz-b")["id"]
    assert _answer(world, bid, "x1", ["three"]).status_code == 201
    statements.clear()
    r = _answer(world, bid, "x1", ["two"])
    assert r.status_code == 200 and r.get_json()["times_answered"] == 2
    assert _kinds(statements) == ["token+attempt", "insert", "attempt+item", "replace"]


def test_token_is_checked_before_the_attempt(
    world: World, session: Session, statements: list[str]
) -> None:
    """A revoked token is a 401 although its statement read the attempt; another student's
    attempt a 403 and an unknown one a 404, as without the joined read."""
    aid = world.start("quiz-a")["id"]
    assert _answer(world, aid, "q1", ["b"], who="bob").status_code == 403
    assert _answer(world, "0" * 32, "q1", ["b"]).status_code == 404
    assert _kinds(statements)[-1] == "token+attempt"
    statements.clear()
    r = _answer(world, "not-an-id", "q1", ["b"])  # can find nothing: the token alone
    assert r.status_code == 404 and _kinds(statements) == ["token"]

    session.execute(update(ApiToken).where(ApiToken.name == "alice").values(revoked=True))
    session.commit()
    statements.clear()
    r = _answer(world, aid, "q1", ["b"])
    assert r.status_code == 401 and _kinds(statements) == ["token+attempt"]
    r = world.client.post(
        f"/api/v1/attempts/{aid}/responses",
        headers={"Authorization": "Bearer kg_" + "x" * 43},
        json={"item_id": "q1", "answer": ["b"]},
    )
    assert r.status_code == 401
    session.rollback()
    assert session.execute(select(ResponseRecord)).all() == []


def test_submitted_attempt_refuses_from_the_joined_read(
    world: World, statements: list[str]
) -> None:
    aid = world.start("quiz-a")["id"]
    assert world.submit(aid).status_code == 200
    statements.clear()
    r = _answer(world, aid, "q1", ["b"])
    assert r.status_code == 409 and "already submitted" in r.get_json()["message"]
    assert _kinds(statements) == ["token+attempt"]
