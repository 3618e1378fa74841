"""The attempts a task may be given up before it may fail are the job's (set at submission), not each worker's.

``tuner_jobs.max_attempts`` (jobs submitted before: 3, the former default).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision: str | None = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_jobs") as batch:
        batch.add_column(sa.Column("max_attempts", sa.Integer(), nullable=False, server_default="3"))


def downgrade() -> None:
    with op.batch_alter_table("tuner_jobs") as batch:
        batch.drop_column("max_attempts")
