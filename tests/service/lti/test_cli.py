"""``kgrade lti``: register and list platforms, print the LMS configuration, rotate keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from service import create_app
from service.cli import main
from service.migrations import upgrade


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'cli.sqlite3'}"
    upgrade(url)
    return url


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


REG = [
    "--issuer",
    "https://moodle.example.edu",
    "--client-id",
    "abc123",
    "--deployment",
    "1",
    "--login-url",
    "https://moodle.example.edu/mod/lti/auth.php",
    "--token-url",
    "https://moodle.example.edu/mod/lti/token.php",
    "--jwks-url",
    "https://moodle.example.edu/mod/lti/certs.php",
]


def test_register_list_and_update(db_url: str) -> None:
    out = run("lti", "register", *REG, "--database-url", db_url)
    assert "registered platform #1" in out and "deployments 1" in out
    again = run("lti", "register", *REG, "--deployment", "2", "--database-url", db_url)
    assert "updated platform #1" in again
    # Hosted Canvas: one issuer, many client ids.
    run("lti", "register", *REG[:2], "--client-id", "other", *REG[4:], "--database-url", db_url)
    listed = json.loads(run("lti", "platforms", "--json", "--database-url", db_url))
    assert [(p["client_id"], p["deployments"]) for p in listed] == [
        ("abc123", ["1", "2"]),
        ("other", ["1"]),
    ]
    assert "issuer https://moodle.example.edu" in run("lti", "platforms", "--database-url", db_url)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (["--login-url", "ftp://x"], "must be an http(s) URL"),
        (["--deployment", " "], "at least one deployment"),
    ],
)
def test_register_refuses_bad_values(db_url: str, change: list[str], says: str) -> None:
    args = list(REG)
    i = args.index(change[0])
    if change[0] == "--deployment":
        args[i + 1] = change[1]
    else:
        args[i + 1] = change[1]
    result = CliRunner().invoke(main, ["lti", "register", *args, "--database-url", db_url])
    assert result.exit_code == 2 and says in result.output


def test_config_prints_what_the_lms_asks_for() -> None:
    out = run("lti", "config", "--base-url", "https://kgrade.example.edu")
    for needle in (
        "https://kgrade.example.edu/lti/login",
        "https://kgrade.example.edu/lti/launch",
        "https://kgrade.example.edu/lti/jwks",
        "Initiate login URL",
        "Redirection URI(s)",
        "Public keyset",
        "Content Selection URL",
        "oidc_initiation_url",
        "kgrade lti register",
    ):
        assert needle in out, needle
    canvas = json.loads(
        run("lti", "config", "--base-url", "https://k.test", "--format", "canvas-json")
    )
    assert canvas["oidc_initiation_url"] == "https://k.test/lti/login"
    assert canvas["target_link_uri"] == "https://k.test/lti/launch"
    assert canvas["public_jwk_url"] == "https://k.test/lti/jwks"
    placements = {p["placement"]: p for p in canvas["extensions"][0]["settings"]["placements"]}
    assert placements["assignment_selection"]["message_type"] == "LtiDeepLinkingRequest"
    assert any(s.endswith("/score") for s in canvas["scopes"])
    bad = CliRunner().invoke(main, ["lti", "config", "--base-url", "kgrade.example.edu"])
    assert bad.exit_code == 2 and "http(s) URL" in bad.output


def test_rotate_key_keeps_the_old_key_published_for_the_grace_period(db_url: str) -> None:
    run("lti", "register", *REG, "--database-url", db_url)
    app = create_app({"DATABASE_URL": db_url, "IMPORT_BANK": False})
    client = app.test_client()
    first = client.get("/lti/jwks").get_json()["keys"]
    assert len(first) == 1
    out = run("lti", "rotate-key", "--grace-days", "7", "--database-url", db_url)
    assert "new signing key" in out and f"retired {first[0]['kid']}" in out
    after = client.get("/lti/jwks").get_json()["keys"]
    assert [k["kid"] for k in after][1:] == [first[0]["kid"]] and len(after) == 2
    run("lti", "rotate-key", "--grace-days", "0", "--database-url", db_url)
    final = client.get("/lti/jwks").get_json()["keys"]
    # The key retired with no grace left the JWKS at once; the one with 7 days stays.
    assert len(final) == 2 and first[0]["kid"] in [k["kid"] for k in final]
    assert after[0]["kid"] not in [k["kid"] for k in final]


def test_course_and_token_commands(db_url: str) -> None:
    run("course", "create", "spring-27", "--title", "Spring 2027", "--database-url", db_url)
    out = run("course", "list", "--database-url", db_url)
    assert "spring-27\tSpring 2027\tlocal" in out and "default" in out
    result = CliRunner().invoke(
        main,
        [
            "token",
            "create",
            "--role",
            "student",
            "--name",
            "zed",
            "--course",
            "nope",
            "--database-url",
            db_url,
        ],
    )
    assert result.exit_code == 2 and "unknown course" in result.output
    token = CliRunner().invoke(
        main,
        [
            "token",
            "create",
            "--role",
            "student",
            "--name",
            "zed",
            "--course",
            "spring-27",
            "--database-url",
            db_url,
        ],
    )
    assert token.exit_code == 0 and "in course 'spring-27'" in token.output
