"""Alembic migrations: ``upgrade head`` builds exactly the models' schema on SQLite and
PostgreSQL, ``downgrade base`` removes it, ``kgrade db upgrade`` imports the item bank, and
0003 moves what 0002 stored into the default course."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import MetaData, create_engine, inspect, select

from service.cli import main
from service.db import Base, load_models
from service.db.quizzes import QuizRecord
from service.migrations import downgrade, upgrade

load_models()
#: Every table of the models: the migrations must build exactly these.
OUR_TABLES = set(Base.metadata.tables)


@pytest.fixture(params=["sqlite", "postgres"])
def empty_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'migrate.sqlite3'}"
    return request.getfixturevalue("pg_schema_factory")("kgm")


def _diffs(url: str) -> list[Any]:
    load_models()
    ours = MetaData(naming_convention=Base.metadata.naming_convention)
    for name in OUR_TABLES:
        Base.metadata.tables[name].to_metadata(ours)
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diffs = compare_metadata(ctx, ours)
    finally:
        engine.dispose()

    def table_of(d: Any) -> str | None:
        d = d[0] if isinstance(d, list) else d
        for part in d[1:]:
            name = getattr(part, "name", None)
            table = getattr(part, "table", None)
            if table is not None:
                return table.name
            if name in OUR_TABLES or isinstance(part, str) and part in OUR_TABLES:
                return name or part
        return None

    return [d for d in diffs if table_of(d) in OUR_TABLES]


def test_upgrade_matches_the_models_and_downgrade_removes(empty_db: str) -> None:
    upgrade(empty_db)
    engine = create_engine(empty_db)
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert tables >= OUR_TABLES
    assert "alembic_version" in tables
    assert _diffs(empty_db) == []
    upgrade(empty_db)  # idempotent
    downgrade(empty_db, "base")
    engine = create_engine(empty_db)
    try:
        assert not (OUR_TABLES & set(inspect(engine).get_table_names()))
    finally:
        engine.dispose()


def test_kgrade_db_upgrade_imports_the_bank(empty_db: str) -> None:
    from item_bank import quiz_ids

    runner = CliRunner()
    result = runner.invoke(main, ["db", "upgrade", "--database-url", empty_db])
    assert result.exit_code == 0, result.output
    assert "imported quizzes" in result.output
    engine = create_engine(empty_db)
    try:
        with engine.connect() as conn:
            ids = conn.execute(select(QuizRecord.id).order_by(QuizRecord.id)).scalars().all()
    finally:
        engine.dispose()
    assert ids == quiz_ids()
    again = runner.invoke(main, ["db", "upgrade", "--database-url", empty_db])
    assert again.exit_code == 0 and "imported" not in again.output


def test_app_tables_from_migrations_serve_requests(empty_db: str) -> None:
    from service import create_app
    from service.auth import create_token
    from service.extensions import db

    upgrade(empty_db)
    app = create_app({"DATABASE_URL": empty_db})  # imports the bank at start-up
    with app.app_context():
        token = create_token(db.session, role="student", name="m")[1]
        db.session.commit()
    r = app.test_client().get("/api/v1/quizzes", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200 and len(r.get_json()) >= 2
    db_engine = app.extensions["kgrade.db"][0]
    db_engine.dispose()
