"""Alembic migrations for kgrade's database, runnable without an alembic.ini.

``upgrade(url)`` is what ``kgrade db upgrade`` runs. Revisions live in ``versions/``; a feature
that adds tables (see ``service.db``) adds a revision whose ``down_revision`` is the current
head. ``alembic_config(url)`` gives a Config for the alembic API (``command.revision(...,
autogenerate=True)`` writes a new revision from the models).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection

from service.config import normalize_database_url

HERE = Path(__file__).resolve().parent


def alembic_config(url: str | None = None, connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    if url is not None:
        # ConfigParser interpolation would choke on a % in a password.
        cfg.set_main_option("sqlalchemy.url", normalize_database_url(url).replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)
