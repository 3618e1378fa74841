"""The job queue: jobs, their tasks (one per shape), workers with leases, and trial slots.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tuner_jobs",
        sa.Column("id", _ID, nullable=False),
        sa.Column("template", sa.String(128), nullable=False),
        sa.Column("template_version", sa.String(64), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("device_kind", sa.String(16), nullable=False),
        sa.Column("device_name", sa.String(256), nullable=True),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("sampler", sa.String(32), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("candidate_timeout_s", sa.Double(), nullable=False),
        sa.Column("finalists", sa.Integer(), nullable=False),
        sa.Column("comparators", sa.Boolean(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("submitted_by", sa.String(128), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.Column("finished_at", _TS, nullable=True),
        sa.CheckConstraint(
            "state IN ('queued', 'running', 'done', 'failed', 'cancelled')", name=op.f("ck_tuner_jobs_state")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_jobs")),
    )
    op.create_index("ix_tuner_jobs_state_priority", "tuner_jobs", ["state", "priority"])
    op.create_table(
        "tuner_tasks",
        sa.Column("id", _ID, nullable=False),
        sa.Column("job_id", _ID, nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("label", sa.String(256), nullable=False),
        sa.Column("shape_key", sa.String(1024), nullable=False),
        sa.Column("shape_json", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("trials_target", sa.Integer(), nullable=False),
        sa.Column("trials_reserved", sa.Integer(), nullable=False),
        sa.Column("trials_done", sa.Integer(), nullable=False),
        sa.Column("trials_failed", sa.Integer(), nullable=False),
        sa.Column("study_id", _ID, nullable=True),
        sa.Column("finalizer_id", sa.String(64), nullable=True),
        sa.Column("best_us", sa.Double(), nullable=True),
        sa.Column("best_config_json", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("updated_at", _TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["tuner_jobs.id"], name=op.f("fk_tuner_tasks_job_id_tuner_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["study_id"], ["tuner_studies.id"], name=op.f("fk_tuner_tasks_study_id_tuner_studies"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_tasks")),
        sa.UniqueConstraint("job_id", "shape_key", name="uq_tuner_tasks_job_shape"),
    )
    op.create_index("ix_tuner_tasks_state", "tuner_tasks", ["state"])
    op.create_table(
        "tuner_workers",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("device_kind", sa.String(16), nullable=False),
        sa.Column("device_name", sa.String(256), nullable=False),
        sa.Column("device_index", sa.Integer(), nullable=False),
        sa.Column("backends_json", sa.Text(), nullable=False),
        sa.Column("fingerprint_hash", sa.String(64), nullable=False),
        sa.Column("fingerprint_json", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("current_task_id", _ID, nullable=True),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("last_heartbeat", _TS, nullable=False),
        sa.Column("lease_expires_at", _TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["current_task_id"], ["tuner_tasks.id"], name=op.f("fk_tuner_workers_current_task_id_tuner_tasks"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_workers")),
    )
    op.create_table(
        "tuner_slots",
        sa.Column("id", _ID, nullable=False),
        sa.Column("task_id", _ID, nullable=False),
        sa.Column("worker_id", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("trial_number", sa.Integer(), nullable=True),
        sa.Column("measurement_id", _ID, nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.CheckConstraint("state IN ('reserved', 'done')", name=op.f("ck_tuner_slots_state")),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tuner_tasks.id"], name=op.f("fk_tuner_slots_task_id_tuner_tasks"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["measurement_id"], ["tuner_measurements.id"],
            name=op.f("fk_tuner_slots_measurement_id_tuner_measurements"), ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_slots")),
    )
    op.create_index("ix_tuner_slots_task_state", "tuner_slots", ["task_id", "state"])
    op.create_index("ix_tuner_slots_worker", "tuner_slots", ["worker_id"])


def downgrade() -> None:
    op.drop_index("ix_tuner_slots_worker", table_name="tuner_slots")
    op.drop_index("ix_tuner_slots_task_state", table_name="tuner_slots")
    op.drop_table("tuner_slots")
    op.drop_table("tuner_workers")
    op.drop_index("ix_tuner_tasks_state", table_name="tuner_tasks")
    op.drop_table("tuner_tasks")
    op.drop_index("ix_tuner_jobs_state_priority", table_name="tuner_jobs")
    op.drop_table("tuner_jobs")
