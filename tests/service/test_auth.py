"""Bearer tokens: 401 without a valid one, 403 for the wrong role, stored only as a hash."""

from __future__ import annotations

from click.testing import CliRunner
from flask import Flask
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.cli import main
from service.db.tokens import ApiToken
from tests.service.conftest import World


def test_missing_token_is_401_with_challenge(world: World) -> None:
    r = world.client.get("/api/v1/quizzes")
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    body = r.get_json()
    assert body["code"] == 401 and "Authorization" in body["message"]


def test_malformed_and_unknown_tokens_are_401(world: World) -> None:
    for header in (
        "Basic dXNlcjpwdw==",
        "Bearer",
        "Bearer ",
        "Bearer kg_not-a-real-token",
        "Bearer " + "x" * 5000,
        world.tokens["alice"],  # no scheme
    ):
        r = world.client.get("/api/v1/quizzes", headers={"Authorization": header})
        assert r.status_code == 401, header
        assert r.is_json


def test_revoked_token_is_401(world: World, session: Session) -> None:
    assert world.get("/api/v1/whoami", "bob").status_code == 200
    row = session.execute(select(ApiToken).where(ApiToken.name == "bob")).scalar_one()
    row.revoked = True
    session.commit()
    assert world.get("/api/v1/whoami", "bob").status_code == 401


def test_whoami(world: World) -> None:
    assert world.get("/api/v1/whoami", "alice").get_json() == {"name": "alice", "role": "student"}
    assert world.get("/api/v1/whoami", "prof").get_json() == {"name": "prof", "role": "instructor"}


def test_students_get_403_on_instructor_endpoints(world: World) -> None:
    for method, url in (
        ("post", "/api/v1/quizzes"),
        ("put", "/api/v1/quizzes/quiz-a"),
        ("get", "/api/v1/quizzes/quiz-a/data"),
        ("get", "/api/v1/quizzes/quiz-a/grades"),
        ("get", "/api/v1/quizzes/quiz-a/grades.csv"),
        ("post", "/api/v1/quizzes/quiz-a/regrade"),
        ("get", "/api/v1/quizzes/quiz-a/export?format=qti12"),
    ):
        r = getattr(world, method)(url, "alice", json={})
        assert r.status_code == 403, (method, url, r.get_json())
        assert "instructor" in r.get_json()["message"]


def test_instructors_get_403_on_student_endpoints(world: World) -> None:
    r = world.post("/api/v1/quizzes/quiz-a/attempts", "prof", json={})
    assert r.status_code == 403
    attempt = world.start("quiz-a")
    r = world.post(
        f"/api/v1/attempts/{attempt['id']}/responses",
        "prof",
        json={"item_id": "q1", "answer": ["b"]},
    )
    assert r.status_code == 403
    assert world.post(f"/api/v1/attempts/{attempt['id']}/submit", "prof").status_code == 403
    # ...but may read any attempt.
    assert world.get(f"/api/v1/attempts/{attempt['id']}", "prof").status_code == 200


def test_auth_runs_before_body_validation(world: World) -> None:
    r = world.client.post("/api/v1/quizzes", data="{not json", content_type="application/json")
    assert r.status_code == 401


def test_another_students_attempt_is_403(world: World) -> None:
    attempt = world.start("quiz-a", who="alice")
    aid = attempt["id"]
    assert world.get(f"/api/v1/attempts/{aid}", "bob").status_code == 403
    assert world.answer(aid, "q1", ["b"], who="bob").status_code == 403
    assert world.submit(aid, who="bob").status_code == 403


def test_tokens_are_stored_hashed(world: World, session: Session) -> None:
    rows = session.execute(select(ApiToken)).scalars().all()
    stored = {r.token_hash for r in rows}
    assert len(rows) == 3
    for plaintext in world.tokens.values():
        assert plaintext not in stored
        assert all(len(h) == 64 for h in stored)


def test_cli_token_create_prints_a_working_token(app: Flask, backend: str) -> None:
    runner = CliRunner()
    result = runner.invoke(
        main, ["token", "create", "--role", "student", "--name", "carol", "--database-url", backend]
    )
    assert result.exit_code == 0, result.output
    token = result.stdout.strip().splitlines()[-1]
    assert token.startswith("kg_")
    r = app.test_client().get("/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert r.get_json() == {"name": "carol", "role": "student"}
    listed = runner.invoke(main, ["token", "list", "--database-url", backend])
    assert "carol" in listed.stdout and token not in listed.stdout
    token_id = listed.stdout.split("\t")[0]
    assert (
        runner.invoke(main, ["token", "revoke", token_id, "--database-url", backend]).exit_code == 0
    )
    r = app.test_client().get("/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401


def test_cli_token_create_rejects_bad_role(backend: str) -> None:
    result = CliRunner().invoke(
        main, ["token", "create", "--role", "admin", "--name", "x", "--database-url", backend]
    )
    assert result.exit_code == 2
    assert "admin" in result.output
