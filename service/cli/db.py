"""``kgrade db``: apply migrations and import the item bank."""

from __future__ import annotations

import click

from service.config import load_config

DB_URL_OPTION = click.option(
    "--database-url",
    "database_url",
    envvar="DATABASE_URL",
    default=None,
    help="SQLAlchemy URL (default: $DATABASE_URL, else sqlite var/kgrade.sqlite3).",
)


def resolve_url(database_url: str | None) -> str:
    return load_config({"DATABASE_URL": database_url} if database_url else None)["DATABASE_URL"]


def display_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def upgrade_and_import(url: str, *, import_bank: bool = True) -> None:
    """Migrate ``url`` to head, then bring the shipped item bank into it."""
    from service.db import make_engine, write_intent
    from service.migrations import upgrade
    from service.quizzes_store import sync_bank

    upgrade(url)
    if not import_bank:
        return
    from sqlalchemy.orm import Session

    engine = make_engine(url)
    try:
        with write_intent(), Session(engine) as session:
            result = sync_bank(session)
            session.commit()
    finally:
        engine.dispose()
    for line in result.errors:
        click.echo(f"warning: item bank: {line}", err=True)
    if result.created:
        click.echo(f"imported quizzes: {', '.join(result.created)}")
    if result.updated:
        click.echo(f"updated quizzes from the item bank: {', '.join(result.updated)}")
    if result.kept:
        click.echo(f"kept instructor-edited quizzes: {', '.join(result.kept)}")


@click.group()
def db() -> None:
    """Database migrations (Alembic)."""


@db.command("upgrade")
@DB_URL_OPTION
@click.option("--revision", default="head", show_default=True, help="Target revision.")
@click.option("--no-import", is_flag=True, help="Do not import the item bank's quizzes.")
def upgrade_cmd(database_url: str | None, revision: str, no_import: bool) -> None:
    """Apply migrations (to head by default) and import the item bank's quizzes."""
    url = resolve_url(database_url)
    click.echo(f"migrating {display_url(url)}")
    if revision != "head":
        from service.migrations import upgrade

        upgrade(url, revision)
        return
    upgrade_and_import(url, import_bank=not no_import)


@db.command("downgrade")
@DB_URL_OPTION
@click.argument("revision")
def downgrade_cmd(database_url: str | None, revision: str) -> None:
    """Revert migrations down to REVISION (``base`` drops every table)."""
    from service.migrations import downgrade

    downgrade(resolve_url(database_url), revision)


@db.command("current")
@DB_URL_OPTION
def current_cmd(database_url: str | None) -> None:
    """Print the database's current revision."""
    from alembic import command

    from service.migrations import alembic_config

    command.current(alembic_config(resolve_url(database_url)))


@db.command("heads")
def heads_cmd() -> None:
    """Print the newest revision(s) (a new revision's down_revision)."""
    from alembic import command

    from service.migrations import alembic_config

    command.heads(alembic_config())
