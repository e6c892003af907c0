"""Kernel-exercise submissions and their grading results (tables from ``workers.store``).

Revision ID: 0002_submissions
Revises: 0001_initial
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_submissions"
down_revision: str | Sequence[str] | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "submissions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("exercise_id", sa.String(length=64), nullable=False),
        sa.Column("student", sa.String(length=200), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("source_sha256", sa.String(length=64), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=True),
        sa.Column("reference", sa.Boolean(), nullable=False),
        sa.Column("device", sa.String(length=8), nullable=False),
        sa.Column("queue", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("progress_phase", sa.String(length=32), nullable=True),
        sa.Column("progress_done", sa.Integer(), nullable=True),
        sa.Column("progress_total", sa.Integer(), nullable=True),
        sa.Column("verdict", sa.String(length=32), nullable=True),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("speedup", sa.Float(), nullable=True),
        sa.Column("gradable", sa.Boolean(), nullable=True),
        sa.Column("result_attempt", sa.Integer(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.ForeignKeyConstraint(
            ["token_id"], ["api_tokens.id"], name=op.f("fk_submissions_token_id_api_tokens")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_submissions")),
    )
    op.create_index("ix_submissions_student", "submissions", ["student"], unique=False)
    op.create_index(
        "ix_submissions_exercise_verdict", "submissions", ["exercise_id", "verdict"], unique=False
    )
    op.create_table(
        "submission_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("submission_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("verdict", sa.String(length=32), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("gradable", sa.Boolean(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["submission_id"],
            ["submissions.id"],
            name=op.f("fk_submission_results_submission_id_submissions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_submission_results")),
        # The idempotency key of a grading write: one result per (submission, attempt).
        sa.UniqueConstraint("submission_id", "attempt", name="uq_submission_results_attempt"),
    )


def downgrade() -> None:
    op.drop_table("submission_results")
    op.drop_index("ix_submissions_exercise_verdict", table_name="submissions")
    op.drop_index("ix_submissions_student", table_name="submissions")
    op.drop_table("submissions")
