"""``kgrade token``: create, list and revoke API tokens."""

from __future__ import annotations

import click

from service.cli.db import DB_URL_OPTION, resolve_url
from service.db.tokens import ROLES


def _session(database_url: str | None):  # type: ignore[no-untyped-def]
    from sqlalchemy.orm import Session

    from service.db import load_models, make_engine

    load_models()
    return Session(make_engine(resolve_url(database_url)), expire_on_commit=False)


@click.group()
def token() -> None:
    """API tokens (bearer tokens for instructors and students)."""


@token.command("create")
@click.option("--role", type=click.Choice(ROLES), required=True)
@click.option("--name", required=True, help="Who holds it: a student's name or id.")
@click.option(
    "--course",
    "course_slug",
    default="default",
    show_default=True,
    help="The course it reaches (kgrade course list); it sees only that course's data.",
)
@DB_URL_OPTION
def create_cmd(role: str, name: str, course_slug: str, database_url: str | None) -> None:
    """Create a token and print it (shown once; only its hash is stored)."""
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from service.auth import create_token
    from service.core import people
    from service.core.errors import ServiceError
    from service.db import write_intent

    try:
        with write_intent(), _session(database_url) as session:
            course = people.course_by_slug(session, course_slug)
            row, plaintext = create_token(session, role=role, name=name, course=course)
            session.commit()
    except ServiceError as exc:
        raise click.BadParameter(exc.message, param_hint="--course") from None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--name") from None
    except (OperationalError, ProgrammingError) as exc:
        raise click.ClickException(
            f"cannot store the token ({exc.orig}); run `kgrade db upgrade` first"
        ) from None
    click.echo(f"created {role} token #{row.id} for {name!r} in course {course_slug!r}", err=True)
    click.echo(plaintext)


@click.group()
def course() -> None:
    """Courses: the default one, local ones for stand-alone use, and those LTI launches made."""


@course.command("create")
@click.argument("slug")
@click.option("--title", default=None, help="Shown on its pages (default: the slug).")
@DB_URL_OPTION
def course_create_cmd(slug: str, title: str | None, database_url: str | None) -> None:
    """Create a local course SLUG (then: kgrade token create --course SLUG ...)."""
    from service.core import people
    from service.core.errors import ServiceError
    from service.db import write_intent

    try:
        with write_intent(), _session(database_url) as session:
            people.create_local_course(session, slug, title or slug)
            session.commit()
    except ServiceError as exc:
        raise click.BadParameter(exc.message, param_hint="SLUG") from None
    click.echo(f"created course {slug!r}")


@course.command("list")
@DB_URL_OPTION
def course_list_cmd(database_url: str | None) -> None:
    """List courses: slug, title, and the LMS context they came from."""
    from sqlalchemy import select

    from service.core import people
    from service.db.courses import Course

    with _session(database_url) as session:
        people.default_course(session)
        session.commit()
        for c in session.execute(select(Course).order_by(Course.id)).scalars():
            origin = f"{c.issuer} context {c.context_id}" if c.is_lti else "local"
            click.echo(f"{c.slug}\t{c.title}\t{origin}")


@token.command("list")
@DB_URL_OPTION
def list_cmd(database_url: str | None) -> None:
    """List tokens (id, role, name, created, revoked), never the tokens themselves."""
    from sqlalchemy import select

    from service.db.tokens import ApiToken

    with _session(database_url) as session:
        for t in session.execute(select(ApiToken).order_by(ApiToken.id)).scalars():
            state = "revoked" if t.revoked else "active"
            click.echo(f"{t.id}\t{t.role}\t{t.name}\t{t.created_at:%Y-%m-%d %H:%M}\t{state}")


@token.command("revoke")
@click.argument("token_id", type=int)
@DB_URL_OPTION
def revoke_cmd(token_id: int, database_url: str | None) -> None:
    """Revoke the token with id TOKEN_ID (see `kgrade token list`)."""
    from service.auth import revoke_token
    from service.db import write_intent

    with write_intent(), _session(database_url) as session:
        if not revoke_token(session, token_id):
            raise click.ClickException(f"no token #{token_id}")
        session.commit()
    click.echo(f"revoked token #{token_id}")
