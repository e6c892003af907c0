"""Alembic environment: kgrade's models, SQLite (batch mode) and PostgreSQL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from service.db import Base, load_models, make_engine

config = context.config
load_models()
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        # Batch mode drops and recreates tables that others reference; with foreign keys
        # enforced that DROP fails. The pragma is a no-op inside a transaction, so it goes to
        # the raw connection before Alembic begins one; foreign_key_check below confirms the
        # data still holds together.
        connection.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")
    try:
        _configure_and_run(connection)
    finally:
        if sqlite:
            connection.connection.driver_connection.execute("PRAGMA foreign_keys=ON")


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode recreates the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()
        if connection.dialect.name == "sqlite":
            broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
            if broken:
                raise RuntimeError(f"migration left rows with dangling foreign keys: {broken[:5]}")


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:  # tests pass a connection bound to their own schema
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: set DATABASE_URL or pass --url")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
