"""Courses, users and assignments; LTI 1.3 registrations, keys, launches and grade passbacks;
sessions of the pages. Existing tokens, attempts and submissions move into the ``default``
course, each name becoming a local user.

Revision ID: 0003_lti_courses
Revises: 0002_submissions
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0003_lti_courses"
down_revision: str | Sequence[str] | None = "0002_submissions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer(), nullable=False)


def _pk(table: str, *cols: str) -> sa.PrimaryKeyConstraint:
    return sa.PrimaryKeyConstraint(*(cols or ("id",)), name=op.f(f"pk_{table}"))


def _fk(table: str, col: str, target: str, ondelete: str | None = None) -> sa.ForeignKeyConstraint:
    ref = target.split(".")[0]
    return sa.ForeignKeyConstraint(
        [col], [target], name=op.f(f"fk_{table}_{col}_{ref}"), ondelete=ondelete
    )


def _uq(table: str, *cols: str) -> sa.UniqueConstraint:
    return sa.UniqueConstraint(*cols, name=op.f(f"uq_{table}_{'_'.join(cols)}"))


def _create_tables() -> None:
    s = sa.String
    op.create_table(
        "lti_platforms",
        _id(),
        sa.Column("name", s(200), nullable=False),
        sa.Column("issuer", s(255), nullable=False),
        sa.Column("client_id", s(255), nullable=False),
        sa.Column("auth_login_url", s(1024), nullable=False),
        sa.Column("auth_token_url", s(1024), nullable=False),
        sa.Column("key_set_url", s(1024), nullable=False),
        sa.Column("auth_audience", s(1024), nullable=True),
        sa.Column("key_set", sa.JSON(), nullable=True),
        sa.Column("key_set_fetched_at", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        _pk("lti_platforms"),
        _uq("lti_platforms", "issuer", "client_id"),
    )
    op.create_table(
        "lti_tool_keys",
        _id(),
        sa.Column("kid", s(64), nullable=False),
        sa.Column("private_pem", sa.Text(), nullable=False),
        sa.Column("public_pem", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("retired_at", TS, nullable=True),
        sa.Column("expires_at", TS, nullable=True),
        _pk("lti_tool_keys"),
        _uq("lti_tool_keys", "kid"),
    )
    op.create_table(
        "users",
        _id(),
        sa.Column("issuer", s(255), nullable=False),
        sa.Column("sub", s(255), nullable=False),
        sa.Column("name", s(200), nullable=False),
        sa.Column("email", s(320), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        _pk("users"),
        _uq("users", "issuer", "sub"),
    )
    op.create_table(
        "courses",
        _id(),
        sa.Column("slug", s(64), nullable=False),
        sa.Column("title", s(255), nullable=False),
        sa.Column("label", s(255), nullable=True),
        sa.Column("issuer", s(255), nullable=True),
        sa.Column("context_id", s(255), nullable=True),
        sa.Column("platform_id", sa.Integer(), nullable=True),
        sa.Column("deployment_id", s(255), nullable=True),
        sa.Column("lineitems_url", s(1024), nullable=True),
        sa.Column("ags_scopes", sa.JSON(), nullable=True),
        sa.Column("nrps_url", s(1024), nullable=True),
        sa.Column("roster_synced_at", TS, nullable=True),
        sa.Column("roster_error", s(1000), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        _fk("courses", "platform_id", "lti_platforms.id", "SET NULL"),
        _pk("courses"),
        _uq("courses", "issuer", "context_id"),
        _uq("courses", "slug"),
    )
    op.create_table(
        "lti_access_tokens",
        sa.Column("platform_id", sa.Integer(), nullable=False),
        sa.Column("scopes", s(1024), nullable=False),
        sa.Column("token", sa.Text(), nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        _fk("lti_access_tokens", "platform_id", "lti_platforms.id", "CASCADE"),
        _pk("lti_access_tokens", "platform_id", "scopes"),
    )
    op.create_table(
        "lti_deployments",
        _id(),
        sa.Column("platform_id", sa.Integer(), nullable=False),
        sa.Column("deployment_id", s(255), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        _fk("lti_deployments", "platform_id", "lti_platforms.id", "CASCADE"),
        _pk("lti_deployments"),
        _uq("lti_deployments", "platform_id", "deployment_id"),
    )
    op.create_table(
        "lti_lineitems",
        _id(),
        sa.Column("platform_id", sa.Integer(), nullable=False),
        sa.Column("context_id", s(255), nullable=False),
        sa.Column("resource_id", s(255), nullable=False),
        sa.Column("url", s(1024), nullable=True),
        sa.Column("claimed_at", TS, nullable=False),
        _fk("lti_lineitems", "platform_id", "lti_platforms.id", "CASCADE"),
        _pk("lti_lineitems"),
        _uq("lti_lineitems", "platform_id", "context_id", "resource_id"),
    )
    op.create_table(
        "lti_logins",
        sa.Column("state", s(64), nullable=False),
        sa.Column("nonce", s(128), nullable=False),
        sa.Column("platform_id", sa.Integer(), nullable=False),
        sa.Column("storage_target", s(255), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("consumed_at", TS, nullable=True),
        _fk("lti_logins", "platform_id", "lti_platforms.id", "CASCADE"),
        _pk("lti_logins", "state"),
        _uq("lti_logins", "nonce"),
    )
    op.create_table(
        "assignments",
        sa.Column("id", s(32), nullable=False),
        sa.Column("course_id", sa.Integer(), nullable=False),
        sa.Column("kind", s(16), nullable=False),
        sa.Column("resource_id", s(64), nullable=False),
        sa.Column("title", s(255), nullable=False),
        sa.Column("lang", s(8), nullable=False),
        sa.Column("allowed_attempts", sa.Integer(), nullable=True),
        sa.Column("policy", s(8), nullable=False),
        sa.Column("due_at", TS, nullable=True),
        sa.Column("score_maximum", sa.Float(), nullable=False),
        sa.Column("resource_link_id", s(255), nullable=True),
        sa.Column("lineitem_url", s(1024), nullable=True),
        sa.Column("copied_from", s(32), nullable=True),
        sa.Column("created_by", sa.Integer(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.CheckConstraint("kind IN ('quiz', 'exercise')", name=op.f("ck_assignments_kind")),
        sa.CheckConstraint("policy IN ('best', 'last')", name=op.f("ck_assignments_policy")),
        _fk("assignments", "course_id", "courses.id", "CASCADE"),
        _fk("assignments", "created_by", "users.id", "SET NULL"),
        _pk("assignments"),
        _uq("assignments", "course_id", "resource_link_id"),
    )
    op.create_table(
        "lti_launches",
        sa.Column("id", s(64), nullable=False),
        sa.Column("platform_id", sa.Integer(), nullable=False),
        sa.Column("deployment_id", s(255), nullable=False),
        sa.Column("message_type", s(64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("course_id", sa.Integer(), nullable=True),
        sa.Column("role", s(20), nullable=False),
        sa.Column("resource_link_id", s(255), nullable=True),
        sa.Column("claims", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        _fk("lti_launches", "course_id", "courses.id", "CASCADE"),
        _fk("lti_launches", "platform_id", "lti_platforms.id", "CASCADE"),
        _fk("lti_launches", "user_id", "users.id", "CASCADE"),
        _pk("lti_launches"),
    )
    op.create_index("ix_lti_launches_created_at", "lti_launches", ["created_at"])
    op.create_table(
        "memberships",
        _id(),
        sa.Column("course_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("role", s(20), nullable=False),
        sa.Column("lti_roles", sa.JSON(), nullable=False),
        sa.Column("status", s(16), nullable=False),
        sa.Column("source", s(16), nullable=False),
        sa.Column("last_launch_at", TS, nullable=True),
        sa.Column("updated_at", TS, nullable=False),
        sa.CheckConstraint("role IN ('instructor', 'student')", name=op.f("ck_memberships_role")),
        _fk("memberships", "course_id", "courses.id", "CASCADE"),
        _fk("memberships", "user_id", "users.id", "CASCADE"),
        _pk("memberships"),
        _uq("memberships", "course_id", "user_id"),
    )
    op.create_table(
        "grade_passbacks",
        _id(),
        sa.Column("event", s(128), nullable=False),
        sa.Column("assignment_id", s(32), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("activity_progress", s(16), nullable=False),
        sa.Column("grading_progress", s(16), nullable=False),
        sa.Column("score_given", sa.Float(), nullable=True),
        sa.Column("score_maximum", sa.Float(), nullable=False),
        sa.Column("comment", s(1000), nullable=True),
        sa.Column("timestamp", s(40), nullable=False),
        sa.Column("status", s(16), nullable=False),
        sa.Column("tries", sa.Integer(), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error", s(2000), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("sent_at", TS, nullable=True),
        _fk("grade_passbacks", "assignment_id", "assignments.id", "CASCADE"),
        _fk("grade_passbacks", "user_id", "users.id", "CASCADE"),
        _pk("grade_passbacks"),
        _uq("grade_passbacks", "event"),
    )
    op.create_index(
        "ix_grade_passbacks_assignment_user", "grade_passbacks", ["assignment_id", "user_id"]
    )
    op.create_table(
        "web_sessions",
        _id(),
        sa.Column("token_hash", s(64), nullable=False),
        sa.Column("ticket_hash", s(64), nullable=True),
        sa.Column("ticket_expires_at", TS, nullable=True),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("course_id", sa.Integer(), nullable=False),
        sa.Column("role", s(20), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column("launch_id", s(64), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        _fk("web_sessions", "course_id", "courses.id", "CASCADE"),
        _fk("web_sessions", "launch_id", "lti_launches.id", "SET NULL"),
        _fk("web_sessions", "token_id", "api_tokens.id", "CASCADE"),
        _fk("web_sessions", "user_id", "users.id", "CASCADE"),
        _pk("web_sessions"),
        _uq("web_sessions", "ticket_hash"),
        _uq("web_sessions", "token_hash"),
    )


def _backfill() -> None:
    """Put what exists into the ``default`` course: one local user per name."""
    conn = op.get_bind()
    now = datetime.now(UTC)
    courses = sa.table(
        "courses",
        sa.column("id", sa.Integer),
        sa.column("slug", sa.String),
        sa.column("title", sa.String),
        sa.column("created_at", TS),
    )
    users = sa.table(
        "users",
        sa.column("id", sa.Integer),
        sa.column("issuer", sa.String),
        sa.column("sub", sa.String),
        sa.column("name", sa.String),
        sa.column("created_at", TS),
        sa.column("updated_at", TS),
    )
    members = sa.table(
        "memberships",
        sa.column("course_id", sa.Integer),
        sa.column("user_id", sa.Integer),
        sa.column("role", sa.String),
        sa.column("lti_roles", sa.JSON),
        sa.column("status", sa.String),
        sa.column("source", sa.String),
        sa.column("updated_at", TS),
    )
    conn.execute(
        courses.insert().values(slug="default", title="kgrade (stand-alone)", created_at=now)
    )
    course_id = conn.execute(sa.select(courses.c.id).where(courses.c.slug == "default")).scalar()
    roles: dict[str, str] = {}
    for name, role in conn.execute(sa.text("SELECT name, role FROM api_tokens")):
        if roles.get(name) != "instructor":
            roles[name] = role
    for table in ("attempts", "submissions"):
        for (name,) in conn.execute(sa.text(f"SELECT DISTINCT student FROM {table}")):
            roles.setdefault(name, "student")
    for name, role in sorted(roles.items()):
        conn.execute(
            users.insert().values(
                issuer="local", sub=name, name=name, created_at=now, updated_at=now
            )
        )
        user_id = conn.execute(
            sa.select(users.c.id).where(users.c.issuer == "local", users.c.sub == name)
        ).scalar()
        conn.execute(
            members.insert().values(
                course_id=course_id,
                user_id=user_id,
                role=role,
                lti_roles=[],
                status="active",
                source="token",
                updated_at=now,
            )
        )
    for table, name_col in (
        ("api_tokens", "name"),
        ("attempts", "student"),
        ("submissions", "student"),
    ):
        conn.execute(
            sa.text(
                f"UPDATE {table} SET course_id = :course, user_id = (SELECT users.id FROM users "
                f"WHERE users.issuer = 'local' AND users.sub = {table}.{name_col})"
            ),
            {"course": course_id},
        )


def upgrade() -> None:
    _create_tables()
    for table in ("api_tokens", "attempts", "submissions"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("user_id", sa.Integer(), nullable=True))
            batch.add_column(sa.Column("course_id", sa.Integer(), nullable=True))
            if table != "api_tokens":
                batch.add_column(sa.Column("assignment_id", sa.String(32), nullable=True))
    _backfill()
    ondelete = {"api_tokens": "CASCADE"}
    for table in ("api_tokens", "attempts", "submissions"):
        with op.batch_alter_table(table) as batch:
            batch.alter_column("user_id", existing_type=sa.Integer(), nullable=False)
            batch.alter_column("course_id", existing_type=sa.Integer(), nullable=False)
            batch.create_foreign_key(
                op.f(f"fk_{table}_user_id_users"),
                "users",
                ["user_id"],
                ["id"],
                ondelete=ondelete.get(table),
            )
            batch.create_foreign_key(
                op.f(f"fk_{table}_course_id_courses"),
                "courses",
                ["course_id"],
                ["id"],
                ondelete=ondelete.get(table),
            )
            if table != "api_tokens":
                batch.alter_column("token_id", existing_type=sa.Integer(), nullable=True)
                batch.create_foreign_key(
                    op.f(f"fk_{table}_assignment_id_assignments"),
                    "assignments",
                    ["assignment_id"],
                    ["id"],
                    ondelete="SET NULL",
                )
                batch.create_index(f"ix_{table}_course_user", ["course_id", "user_id"])


def downgrade() -> None:
    for table in ("submissions", "attempts", "api_tokens"):
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(op.f(f"fk_{table}_user_id_users"), type_="foreignkey")
            batch.drop_constraint(op.f(f"fk_{table}_course_id_courses"), type_="foreignkey")
            if table != "api_tokens":
                batch.drop_constraint(
                    op.f(f"fk_{table}_assignment_id_assignments"), type_="foreignkey"
                )
                batch.drop_index(f"ix_{table}_course_user")
                # Rows made from a page have no token; they cannot go back to a schema that
                # requires one.
                op.execute(sa.text(f"DELETE FROM {table} WHERE token_id IS NULL"))
                batch.alter_column("token_id", existing_type=sa.Integer(), nullable=False)
                batch.drop_column("assignment_id")
            batch.drop_column("course_id")
            batch.drop_column("user_id")
    op.drop_table("web_sessions")
    op.drop_index("ix_grade_passbacks_assignment_user", table_name="grade_passbacks")
    op.drop_table("grade_passbacks")
    op.drop_table("memberships")
    op.drop_index("ix_lti_launches_created_at", table_name="lti_launches")
    for table in (
        "lti_launches",
        "assignments",
        "lti_logins",
        "lti_lineitems",
        "lti_deployments",
        "lti_access_tokens",
        "courses",
        "users",
        "lti_tool_keys",
        "lti_platforms",
    ):
        op.drop_table(table)
