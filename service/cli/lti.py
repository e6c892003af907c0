"""``kgrade lti``: register platforms, print what an LMS needs, rotate keys, re-send grades."""

from __future__ import annotations

import json
from datetime import timedelta

import click

from service.cli.db import DB_URL_OPTION, resolve_url


def _session(database_url: str | None):  # type: ignore[no-untyped-def]
    from sqlalchemy.orm import Session

    from service.db import load_models, make_engine

    load_models()
    return Session(make_engine(resolve_url(database_url)), expire_on_commit=False)


def _db_error(exc: Exception) -> click.ClickException:
    return click.ClickException(f"database not ready ({exc}); run `kgrade db upgrade` first")


@click.group()
def lti() -> None:
    """LTI 1.3: platforms (LMSs), the tool's keys and configuration, grade passback."""


@lti.command("register")
@click.option("--issuer", required=True, help="The platform's issuer (iss), e.g. its base URL.")
@click.option("--client-id", required=True, help="The client id the platform gave kgrade.")
@click.option(
    "--deployment",
    "deployments",
    multiple=True,
    required=True,
    help="A deployment id (repeat for several).",
)
@click.option("--login-url", required=True, help="The platform's OIDC authorization URL.")
@click.option("--token-url", required=True, help="The platform's OAuth2 token URL.")
@click.option("--jwks-url", required=True, help="The platform's public keyset (JWKS) URL.")
@click.option("--audience", default=None, help="Token assertion audience, if not the token URL.")
@click.option("--name", default=None, help="A name for it (default: the issuer's host).")
@DB_URL_OPTION
def register_cmd(
    issuer: str,
    client_id: str,
    deployments: tuple[str, ...],
    login_url: str,
    token_url: str,
    jwks_url: str,
    audience: str | None,
    name: str | None,
    database_url: str | None,
) -> None:
    """Register a platform (issuer and client id) with its deployments; running it again
    updates the URLs and adds deployments."""
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from service.db import write_intent
    from service.lti.platforms import PlatformSpec, RegistrationError, register

    spec = PlatformSpec(
        issuer=issuer.strip(),
        client_id=client_id.strip(),
        auth_login_url=login_url.strip(),
        auth_token_url=token_url.strip(),
        key_set_url=jwks_url.strip(),
        deployments=tuple(d.strip() for d in deployments if d.strip()),
        name=name,
        auth_audience=audience,
    )
    try:
        with write_intent(), _session(database_url) as session:
            row, created = register(session, spec)
            session.commit()
    except RegistrationError as exc:
        raise click.BadParameter(str(exc)) from None
    except (OperationalError, ProgrammingError) as exc:
        raise _db_error(exc) from None
    click.echo(
        f"{'registered' if created else 'updated'} platform #{row.id} {row.name!r}: "
        f"issuer {row.issuer}, client id {row.client_id}, deployments {', '.join(spec.deployments)}"
    )


@lti.command("platforms")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@DB_URL_OPTION
def platforms_cmd(as_json: bool, database_url: str | None) -> None:
    """List the registered platforms and their deployments."""
    from service.lti.platforms import all_platforms, deployments

    with _session(database_url) as session:
        rows = [
            {
                "id": p.id,
                "name": p.name,
                "issuer": p.issuer,
                "client_id": p.client_id,
                "deployments": deployments(session, p.id),
                "login_url": p.auth_login_url,
                "token_url": p.auth_token_url,
                "jwks_url": p.key_set_url,
            }
            for p in all_platforms(session)
        ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no platforms registered (kgrade lti register --help)")
    for r in rows:
        click.echo(
            f"#{r['id']}\t{r['name']}\tissuer {r['issuer']}\tclient {r['client_id']}\t"
            f"deployments {', '.join(r['deployments'])}"
        )


@lti.command("config")
@click.option(
    "--base-url",
    required=True,
    help="kgrade's public URL as the LMS reaches it, e.g. https://kgrade.example.edu",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "canvas-json", "json"]),
    default="text",
    show_default=True,
    help="text: everything; canvas-json: only the developer-key JSON; json: all fields.",
)
def config_cmd(base_url: str, fmt: str) -> None:
    """Print what an administrator pastes into the LMS (Moodle's form, Canvas's JSON)."""
    from urllib.parse import urlsplit

    from service.lti import config

    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise click.BadParameter(
            "an http(s) URL, e.g. https://kgrade.example.edu", param_hint="--base-url"
        )
    if parts.scheme == "http":
        click.echo(
            "note: LMSs embed tools over https; plain http only works for a local test LMS",
            err=True,
        )
    if fmt == "canvas-json":
        click.echo(json.dumps(config.canvas_key(base_url), indent=2))
    elif fmt == "json":
        click.echo(
            json.dumps(
                {
                    **config.urls(base_url),
                    "moodle": dict(config.moodle_fields(base_url)),
                    "canvas": config.canvas_key(base_url),
                },
                indent=2,
            )
        )
    else:
        click.echo(config.text(base_url), nl=False)


@lti.command("rotate-key")
@click.option(
    "--grace-days",
    default=7.0,
    show_default=True,
    type=click.FloatRange(0, 365),
    help="How long the old key stays in the JWKS.",
)
@DB_URL_OPTION
def rotate_key_cmd(grace_days: float, database_url: str | None) -> None:
    """Make a new signing key; the old one stays published for the grace period."""
    from service.db import write_intent
    from service.lti import keys

    with write_intent(), _session(database_url) as session:
        new, retired = keys.rotate(session, timedelta(days=grace_days))
        session.commit()
    click.echo(f"new signing key {new.kid}")
    for k in retired:
        click.echo(f"retired {k.kid}: published until {k.expires_at:%Y-%m-%d %H:%M} UTC")


@lti.command("sync-grades")
@click.argument("assignment_id", required=False)
@click.option("--course", "course_slug", default=None, help="Every assignment of this course.")
@DB_URL_OPTION
def sync_grades_cmd(
    assignment_id: str | None, course_slug: str | None, database_url: str | None
) -> None:
    """Send the current grades of an assignment (or of every assignment of a course) to the
    LMS again. The posts run on the lti queue's worker."""
    from sqlalchemy import select

    from service.core import grades, people
    from service.core.errors import ServiceError
    from service.db import write_intent
    from service.db.courses import Assignment

    if not assignment_id and not course_slug:
        raise click.UsageError("give an ASSIGNMENT_ID or --course SLUG")
    with write_intent(), _session(database_url) as session:
        if assignment_id:
            found = session.get(Assignment, assignment_id)
            if found is None:
                raise click.BadParameter(f"no assignment {assignment_id!r}")
            targets = [found]
        else:
            try:
                course = people.course_by_slug(session, course_slug or "")
            except ServiceError as exc:
                raise click.BadParameter(exc.message, param_hint="--course") from None
            targets = list(
                session.execute(
                    select(Assignment).where(Assignment.course_id == course.id)
                ).scalars()
            )
        counts = [(a, grades.resend(session, a)) for a in targets]
        session.commit()
    for a, n in counts:
        click.echo(f"{a.id}\t{a.title}\t{n} grade(s) queued")
