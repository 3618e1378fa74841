"""A verify job's task keeps the verification it recorded: the job page and ``GET /v1/jobs/{id}`` show what it
found (a wrong result on another device name ends the task done, and only the verification says so).

``tuner_tasks.verification_id`` (NULL: a tuning task, or a verify task finished before this revision), a
foreign key to ``tuner_verifications`` that a deleted verification sets to NULL.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision: str | None = "0008"
branch_labels = None
depends_on = None

# Frozen here on purpose: a revision must not change when db/models.py does.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_FK = "fk_tuner_tasks_verification_id_tuner_verifications"


def upgrade() -> None:
    with op.batch_alter_table("tuner_tasks") as batch:
        batch.add_column(sa.Column("verification_id", _ID, nullable=True))
        batch.create_foreign_key(op.f(_FK), "tuner_verifications", ["verification_id"], ["id"], ondelete="SET NULL")


def downgrade() -> None:
    with op.batch_alter_table("tuner_tasks") as batch:
        batch.drop_constraint(op.f(_FK), type_="foreignkey")
        batch.drop_column("verification_id")
