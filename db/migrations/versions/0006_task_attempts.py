"""Mixed fleets: the templates a worker advertises, and the attempts of workers that could not run a task.

``tuner_workers.templates_json`` ({name: version}; NULL for workers registered before: any template),
``tuner_tasks.attempts`` (distinct workers that gave the task up) and ``tuner_task_attempts`` (who and why).
On SQLite, ``tuner_slots`` is rebuilt with AUTOINCREMENT: a deleted slot's id is never given to a new slot
(a worker reaped while cut off would otherwise spend another worker's slot with its old id).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision: str | None = "0005"
branch_labels = None
depends_on = None

# Frozen here on purpose: a revision must not change when db/models.py does.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TS = sa.DateTime(timezone=True)


def _rebuild_slots(*, autoincrement: bool) -> None:
    """SQLite only (PostgreSQL sequences never hand out an id twice). Run with foreign keys off
    (tuner.db.migrate.migrate_to; env.py refuses otherwise): the rebuild drops the table."""
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    with op.batch_alter_table("tuner_slots", recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}):
        pass
    # One sqlite_sequence row per table (it has no unique key): the copy's row is dropped with it, and
    # AUTOINCREMENT starts above the largest id kept.
    bind.exec_driver_sql("DELETE FROM sqlite_sequence WHERE name IN ('tuner_slots', '_alembic_tmp_tuner_slots')")
    if autoincrement:
        bind.exec_driver_sql(
            "INSERT INTO sqlite_sequence (name, seq) SELECT 'tuner_slots', COALESCE(MAX(id), 0) FROM tuner_slots")


def upgrade() -> None:
    _rebuild_slots(autoincrement=True)
    with op.batch_alter_table("tuner_workers") as batch:
        batch.add_column(sa.Column("templates_json", sa.Text(), nullable=True))
    with op.batch_alter_table("tuner_tasks") as batch:
        batch.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "tuner_task_attempts",
        sa.Column("id", _ID, nullable=False),
        sa.Column("task_id", _ID, nullable=False),
        sa.Column("worker_id", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tuner_tasks.id"],
            name=op.f("fk_tuner_task_attempts_task_id_tuner_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_task_attempts")),
        sa.UniqueConstraint("task_id", "worker_id", name=op.f("uq_tuner_task_attempts_task_id_worker_id")),
    )


def downgrade() -> None:
    _rebuild_slots(autoincrement=False)
    op.drop_table("tuner_task_attempts")
    with op.batch_alter_table("tuner_tasks") as batch:
        batch.drop_column("attempts")
    with op.batch_alter_table("tuner_workers") as batch:
        batch.drop_column("templates_json")
