"""Submissions: ``heartbeat_at`` (the job's last sign of life) and ``stuck_requeues`` (how often
the stuck-job reaper queued it again), for fault recovery (docs/faults.md).

Revision ID: 0004_submission_heartbeat
Revises: 0003_lti_courses
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_submission_heartbeat"
down_revision: str | Sequence[str] | None = "0003_lti_courses"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("submissions") as batch:
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(
            sa.Column("stuck_requeues", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("submissions") as batch:
        batch.drop_column("stuck_requeues")
        batch.drop_column("heartbeat_at")
