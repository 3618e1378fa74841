"""Per-kernel device time of each measurement (CUPTI): ``tuner_measurements.kernels_json``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing rows get "{}": no breakdown was recorded for them.
    with op.batch_alter_table("tuner_measurements") as batch:
        batch.add_column(sa.Column("kernels_json", sa.Text(), nullable=False, server_default="{}"))


def downgrade() -> None:
    with op.batch_alter_table("tuner_measurements") as batch:
        batch.drop_column("kernels_json")
