"""Initial schema: studies, measurements, best configs.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels = None
depends_on = None

# Frozen here on purpose: a revision must not change when db/models.py does.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    _create_studies()
    _create_measurements()
    _create_best_configs()


def downgrade() -> None:
    op.drop_table("tuner_best_configs")
    op.drop_index(op.f("ix_tuner_measurements_study_status_median"), table_name="tuner_measurements")
    op.drop_index(op.f("ix_tuner_measurements_study_role"), table_name="tuner_measurements")
    op.drop_table("tuner_measurements")
    op.drop_table("tuner_studies")


def _create_studies() -> None:
    op.create_table(
        "tuner_studies",
        sa.Column("id", _ID, nullable=False),
        sa.Column("name", sa.String(512), nullable=False),
        sa.Column("template", sa.String(128), nullable=False),
        sa.Column("template_version", sa.String(64), nullable=False),
        sa.Column("shape_key", sa.String(1024), nullable=False),
        sa.Column("shape_json", sa.Text(), nullable=False),
        sa.Column("device_kind", sa.String(16), nullable=False),
        sa.Column("device_name", sa.String(256), nullable=False),
        sa.Column("fingerprint_hash", sa.String(64), nullable=False),
        sa.Column("fingerprint_json", sa.Text(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_studies")),
        sa.UniqueConstraint("name", name=op.f("uq_tuner_studies_name")),
        sa.UniqueConstraint(
            "template",
            "template_version",
            "shape_key",
            "device_kind",
            "device_name",
            "fingerprint_hash",
            name=op.f("uq_tuner_studies_key"),
        ),
    )


def _create_measurements() -> None:
    op.create_table(
        "tuner_measurements",
        sa.Column("id", _ID, nullable=False),
        sa.Column("study_id", _ID, nullable=False),
        sa.Column("role", sa.String(8), nullable=False),
        sa.Column("round_id", sa.String(64), nullable=True),
        sa.Column("candidate", sa.String(256), nullable=False),
        sa.Column("trial_number", sa.Integer(), nullable=True),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("errors_json", sa.Text(), nullable=False),
        *[sa.Column(name, sa.Double(), nullable=True) for name in _FIGURES],
        sa.Column("n_samples", sa.Integer(), nullable=True),
        sa.Column("timer", sa.String(32), nullable=True),
        *[sa.Column(name, sa.Double(), nullable=True) for name in ("build_s", "verify_s", "measure_s")],
        sa.Column("worker", sa.String(256), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_measurements")),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["tuner_studies.id"],
            name=op.f("fk_tuner_measurements_study_id_tuner_studies"),
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("role IN ('trial', 'final')", name=op.f("ck_tuner_measurements_role")),
    )
    op.create_index(op.f("ix_tuner_measurements_study_role"), "tuner_measurements", ["study_id", "role"])
    op.create_index(
        op.f("ix_tuner_measurements_study_status_median"),
        "tuner_measurements",
        ["study_id", "status", "median_us"],
    )


_FIGURES = ("median_us", "p20_us", "p80_us", "mean_us", "min_us", "max_us")


def _create_best_configs() -> None:
    op.create_table(
        "tuner_best_configs",
        sa.Column("id", _ID, nullable=False),
        sa.Column("study_id", _ID, nullable=False),
        sa.Column("measurement_id", _ID, nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("median_us", sa.Double(), nullable=False),
        sa.Column("p20_us", sa.Double(), nullable=True),
        sa.Column("p80_us", sa.Double(), nullable=True),
        sa.Column("n_samples", sa.Integer(), nullable=True),
        sa.Column("timer", sa.String(32), nullable=True),
        sa.Column("template", sa.String(128), nullable=False),
        sa.Column("template_version", sa.String(64), nullable=False),
        sa.Column("shape_key", sa.String(1024), nullable=False),
        sa.Column("shape_json", sa.Text(), nullable=False),
        sa.Column("device_kind", sa.String(16), nullable=False),
        sa.Column("device_name", sa.String(256), nullable=False),
        sa.Column("fingerprint_hash", sa.String(64), nullable=False),
        sa.Column("published_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_best_configs")),
        sa.UniqueConstraint("study_id", name=op.f("uq_tuner_best_configs_study_id")),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["tuner_studies.id"],
            name=op.f("fk_tuner_best_configs_study_id_tuner_studies"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["measurement_id"],
            ["tuner_measurements.id"],
            name=op.f("fk_tuner_best_configs_measurement_id_tuner_measurements"),
        ),
    )
    op.create_index(
        op.f("ix_tuner_best_configs_lookup"),
        "tuner_best_configs",
        ["template", "shape_key", "device_kind", "device_name"],
    )
