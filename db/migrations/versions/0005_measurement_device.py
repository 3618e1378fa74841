"""The device each measurement ran on: ``tuner_measurements.device_index`` and ``device_uuid``.

Several workers of one host (one per GPU) share a study, whose key names the device model only; each
measurement records which GPU it ran on (the worker's registered index and the GPU's UUID).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision: str | None = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing rows keep NULL: which GPU measured them was not recorded.
    with op.batch_alter_table("tuner_measurements") as batch:
        batch.add_column(sa.Column("device_index", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("device_uuid", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_measurements") as batch:
        batch.drop_column("device_uuid")
        batch.drop_column("device_index")
