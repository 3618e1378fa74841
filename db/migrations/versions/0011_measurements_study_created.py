"""An index of measurements by (study, time): the overview's studies "latest measured first"
(``GET /v1/studies?order=activity``, polled every 3 s by each open overview page) reads each study's newest
measurement through it, one index probe per study, instead of grouping the whole measurements table on
every request.

``ix_tuner_measurements_study_created`` on ``tuner_measurements (study_id, created_at)``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision: str | None = "0010"
branch_labels = None
depends_on = None

_INDEX = "ix_tuner_measurements_study_created"


def upgrade() -> None:
    op.create_index(_INDEX, "tuner_measurements", ["study_id", "created_at"])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="tuner_measurements")
