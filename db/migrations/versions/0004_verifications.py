"""Verifications of published bests (``tuner verify``) and job kinds (``tune`` | ``verify``).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels = None
depends_on = None

# Frozen here on purpose: a revision must not change when db/models.py does.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tuner_verifications",
        sa.Column("id", _ID, nullable=False),
        sa.Column("study_id", _ID, nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("stored_us", sa.Double(), nullable=False),
        sa.Column("median_us", sa.Double(), nullable=True),
        sa.Column("low_us", sa.Double(), nullable=True),
        sa.Column("high_us", sa.Double(), nullable=True),
        sa.Column("drift", sa.Double(), nullable=True),
        sa.Column("tolerance", sa.Double(), nullable=False),
        sa.Column("flagged", sa.Boolean(), nullable=False),
        sa.Column("processes", sa.Integer(), nullable=False),
        sa.Column("figures_json", sa.Text(), nullable=False),
        sa.Column("device_kind", sa.String(16), nullable=False),
        sa.Column("device_name", sa.String(256), nullable=False),
        sa.Column("fingerprint_hash", sa.String(64), nullable=False),
        sa.Column("fingerprint_json", sa.Text(), nullable=False),
        sa.Column("worker", sa.String(256), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["study_id"], ["tuner_studies.id"], name=op.f("fk_tuner_verifications_study_id_tuner_studies"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_verifications")),
    )
    op.create_index("ix_tuner_verifications_study", "tuner_verifications", ["study_id", "created_at"])
    # Existing jobs are tuning jobs; a verify job re-measures published bests (its tasks have no trials).
    with op.batch_alter_table("tuner_jobs") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="tune"))
        batch.add_column(sa.Column("processes", sa.Integer(), nullable=True))
        batch.create_check_constraint("kind", "kind IN ('tune', 'verify')")


def downgrade() -> None:
    with op.batch_alter_table("tuner_jobs") as batch:
        batch.drop_constraint("ck_tuner_jobs_kind", type_="check")
        batch.drop_column("processes")
        batch.drop_column("kind")
    op.drop_index("ix_tuner_verifications_study", table_name="tuner_verifications")
    op.drop_table("tuner_verifications")
