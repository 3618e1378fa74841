"""A job submission may carry an idempotency key (``Idempotency-Key`` on ``POST /v1/jobs``; ``tuner submit``
sends one and repeats a request whose answer it lost): the same key again finds the job it created, another
request under that key is refused, and a retry never queues the same sweep twice.

``tuner_jobs.idempotency_key`` (unique; NULL: none given, and every job submitted before) and
``tuner_jobs.request_hash`` (the hash of the request that created the job).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision: str | None = "0009"
branch_labels = None
depends_on = None

_UNIQUE = "uq_tuner_jobs_idempotency_key"  # the models' naming convention, frozen here


def upgrade() -> None:
    with op.batch_alter_table("tuner_jobs") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(128), nullable=True))
        batch.add_column(sa.Column("request_hash", sa.String(64), nullable=True))
        batch.create_unique_constraint(_UNIQUE, ["idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("tuner_jobs") as batch:
        batch.drop_constraint(_UNIQUE, type_="unique")
        batch.drop_column("request_hash")
        batch.drop_column("idempotency_key")
