"""A verify job may re-measure the comparators in its first N processes only (``tuner verify
--comparator-processes``): a comparator that compiles for minutes in each new process is then built once.

``tuner_jobs.comparator_processes`` (NULL: the comparators in every process; jobs submitted before: NULL).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision: str | None = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_jobs") as batch:
        batch.add_column(sa.Column("comparator_processes", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_jobs") as batch:
        batch.drop_column("comparator_processes")
