"""ORM models of tuner's tables (internal to ``db``: callers get :mod:`tuner.store.records`, never these rows).

Every table name starts with ``tuner_`` (Optuna's tables share the database). JSON columns hold
canonical JSON text (sorted keys, no spaces) so that equal values compare equal as text and NaN errors
survive (PostgreSQL's JSON types reject NaN). Times are microseconds, durations seconds, timestamps UTC.
The schema is created by the Alembic revisions in ``db/migrations/versions``, not by ``create_all``;
``tests/db`` checks that the two agree.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from tuner.db._convert import as_utc

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments an INTEGER PRIMARY KEY; elsewhere ids are 64-bit.
IdType = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def store_now(session: Session) -> datetime:
    """The store's clock, in UTC: PostgreSQL's (its statement's start), else this host's (SQLite is a local
    file: its clock is this host's). Leases are set and judged by it: workers on several hosts whose clocks
    differ by more than a lease would otherwise reap each other, or keep a dead worker for as long."""
    if session.get_bind().dialect.name == "postgresql":
        value = session.scalar(select(func.statement_timestamp()))
        if isinstance(value, datetime):
            return as_utc(value)
    return utcnow()


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class StudyRow(Base):
    """One study key: template@version × shape × device × software fingerprint (= one Optuna study)."""

    __tablename__ = "tuner_studies"
    __table_args__ = (
        UniqueConstraint(
            "template",
            "template_version",
            "shape_key",
            "device_kind",
            "device_name",
            "fingerprint_hash",
            name="uq_tuner_studies_key",
        ),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    name: Mapped[str] = mapped_column(String(512), unique=True)  # the Optuna study name
    template: Mapped[str] = mapped_column(String(128))
    template_version: Mapped[str] = mapped_column(String(64))
    shape_key: Mapped[str] = mapped_column(String(1024))  # canonical text, tuner.frozen.Shape.key()
    shape_json: Mapped[str] = mapped_column(Text)
    device_kind: Mapped[str] = mapped_column(String(16))
    device_name: Mapped[str] = mapped_column(String(256))
    fingerprint_hash: Mapped[str] = mapped_column(String(64))
    fingerprint_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class MeasurementRow(Base):
    """One measured candidate (success or failure) of a study, in a sweep trial or a final round."""

    __tablename__ = "tuner_measurements"
    __table_args__ = (
        CheckConstraint("role IN ('trial', 'final')", name="role"),
        Index("ix_tuner_measurements_study_role", "study_id", "role"),
        Index("ix_tuner_measurements_study_status_median", "study_id", "status", "median_us"),
        Index("ix_tuner_measurements_study_created", "study_id", "created_at"),  # a study's newest (0011)
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(8))
    round_id: Mapped[str | None] = mapped_column(String(64))
    candidate: Mapped[str] = mapped_column(String(256))  # 'config' | 'default' | 'comparator:<name>'
    trial_number: Mapped[int | None] = mapped_column(Integer)
    config_json: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(32))  # tuner.results.Status values
    reason: Mapped[str | None] = mapped_column(Text)
    errors_json: Mapped[str] = mapped_column(Text)  # output name -> relative L2 error
    kernels_json: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")  # name -> median µs
    median_us: Mapped[float | None] = mapped_column(Double)
    p20_us: Mapped[float | None] = mapped_column(Double)
    p80_us: Mapped[float | None] = mapped_column(Double)
    mean_us: Mapped[float | None] = mapped_column(Double)
    min_us: Mapped[float | None] = mapped_column(Double)
    max_us: Mapped[float | None] = mapped_column(Double)
    n_samples: Mapped[int | None] = mapped_column(Integer)
    timer: Mapped[str | None] = mapped_column(String(32))  # tuner.results.Timer values
    build_s: Mapped[float | None] = mapped_column(Double)
    verify_s: Mapped[float | None] = mapped_column(Double)
    measure_s: Mapped[float | None] = mapped_column(Double)
    worker: Mapped[str | None] = mapped_column(String(256))  # host/pid that measured
    device_index: Mapped[int | None] = mapped_column(Integer)  # the measuring worker's device index
    device_uuid: Mapped[str | None] = mapped_column(String(64))  # the GPU's UUID, where the backend knows it
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class BestConfigRow(Base):
    """The published best config of one study, with its key denormalised for lookups."""

    __tablename__ = "tuner_best_configs"
    __table_args__ = (
        Index("ix_tuner_best_configs_lookup", "template", "shape_key", "device_kind", "device_name"),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id", ondelete="CASCADE"), unique=True)
    measurement_id: Mapped[int] = mapped_column(ForeignKey("tuner_measurements.id"))
    config_json: Mapped[str] = mapped_column(Text)
    median_us: Mapped[float] = mapped_column(Double)
    p20_us: Mapped[float | None] = mapped_column(Double)
    p80_us: Mapped[float | None] = mapped_column(Double)
    n_samples: Mapped[int | None] = mapped_column(Integer)
    timer: Mapped[str | None] = mapped_column(String(32))
    template: Mapped[str] = mapped_column(String(128))
    template_version: Mapped[str] = mapped_column(String(64))
    shape_key: Mapped[str] = mapped_column(String(1024))
    shape_json: Mapped[str] = mapped_column(Text)
    device_kind: Mapped[str] = mapped_column(String(16))
    device_name: Mapped[str] = mapped_column(String(256))
    fingerprint_hash: Mapped[str] = mapped_column(String(64))
    published_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class VerificationRow(Base):
    """One re-measurement of a study's published best in fresh processes (``tuner verify``, revision 0004)."""

    __tablename__ = "tuner_verifications"
    __table_args__ = (Index("ix_tuner_verifications_study", "study_id", "created_at"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id", ondelete="CASCADE"))
    config_json: Mapped[str] = mapped_column(Text)  # the best config re-measured
    stored_us: Mapped[float] = mapped_column(Double)  # its published median
    median_us: Mapped[float | None] = mapped_column(Double)  # median over processes of their medians
    low_us: Mapped[float | None] = mapped_column(Double)  # lowest process median
    high_us: Mapped[float | None] = mapped_column(Double)  # highest process median
    drift: Mapped[float | None] = mapped_column(Double)  # median_us / stored_us - 1
    tolerance: Mapped[float] = mapped_column(Double)
    flagged: Mapped[bool] = mapped_column()  # |drift| > tolerance, or no process measured it
    processes: Mapped[int] = mapped_column(Integer)
    figures_json: Mapped[str] = mapped_column(Text)  # per process, per candidate: status, median, p20, p80
    device_kind: Mapped[str] = mapped_column(String(16))  # where it was re-measured
    device_name: Mapped[str] = mapped_column(String(256))
    fingerprint_hash: Mapped[str] = mapped_column(String(64))
    fingerprint_json: Mapped[str] = mapped_column(Text)
    worker: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


# -- the job queue (revision 0002) ----------------------------------------------------------------------
JOB_KINDS = ("tune", "verify")  # revision 0004; tuner.store.records checks them
JOB_STATES = ("queued", "running", "done", "failed", "cancelled")
TASK_STATES = ("queued", "running", "finalizing", "done", "failed", "cancelled")
WORKER_STATES = ("idle", "busy", "stopped", "lost")


class JobRow(Base):
    """A tuning job: one template, several shapes (tasks), a device requirement and a budget per shape."""

    __tablename__ = "tuner_jobs"
    __table_args__ = (
        CheckConstraint("state IN ('queued', 'running', 'done', 'failed', 'cancelled')", name="state"),
        CheckConstraint("kind IN ('tune', 'verify')", name="kind"),
        Index("ix_tuner_jobs_state_priority", "state", "priority"),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    template: Mapped[str] = mapped_column(String(128))
    template_version: Mapped[str] = mapped_column(String(64))
    backend: Mapped[str] = mapped_column(String(32))  # a worker must declare it (triton | tilelang)
    device_kind: Mapped[str] = mapped_column(String(16))
    device_name: Mapped[str | None] = mapped_column(String(256))  # None: any device of the kind
    trials: Mapped[int] = mapped_column(Integer)  # measured trials per shape
    sampler: Mapped[str] = mapped_column(String(32))
    seed: Mapped[int | None] = mapped_column(Integer)
    samples: Mapped[int] = mapped_column(Integer)
    candidate_timeout_s: Mapped[float] = mapped_column(Double)
    finalists: Mapped[int] = mapped_column(Integer)
    comparators: Mapped[bool] = mapped_column(default=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default="queued")
    error: Mapped[str | None] = mapped_column(Text)
    submitted_by: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # 'tune': trials then a final round; 'verify': re-measure each shape's published best in ``processes``
    # fresh processes (its tasks have no trials)
    kind: Mapped[str] = mapped_column(String(16), default="tune", server_default="tune")
    processes: Mapped[int | None] = mapped_column(Integer)
    # verify jobs: the comparators are re-measured in the first N processes only (None: in every one); revision 0008
    comparator_processes: Mapped[int | None] = mapped_column(Integer)
    # distinct workers that may give a task up (a task-specific local failure) before it may fail: the
    # server's setting at submission (TUNER_TASK_ATTEMPTS), the same for every worker
    max_attempts: Mapped[int] = mapped_column(Integer, default=3, server_default="3")
    # a submission repeated with the same key (a client retrying after a lost answer) finds the job it created
    # instead of creating another; the request's hash tells a repeat from another request (revision 0010)
    idempotency_key: Mapped[str | None] = mapped_column(String(128), unique=True)
    request_hash: Mapped[str | None] = mapped_column(String(64))


class TaskRow(Base):
    """One shape of a job. Trials are counted through slots: reserved before a trial, done with its
    measurement in the same transaction, so that counts add up exactly whoever measures."""

    __tablename__ = "tuner_tasks"
    __table_args__ = (
        UniqueConstraint("job_id", "shape_key", name="uq_tuner_tasks_job_shape"),
        Index("ix_tuner_tasks_state", "state"),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("tuner_jobs.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    label: Mapped[str] = mapped_column(String(256))
    shape_key: Mapped[str] = mapped_column(String(1024))
    shape_json: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default="queued")
    trials_target: Mapped[int] = mapped_column(Integer)
    trials_reserved: Mapped[int] = mapped_column(Integer, default=0)
    trials_done: Mapped[int] = mapped_column(Integer, default=0)
    trials_failed: Mapped[int] = mapped_column(Integer, default=0)
    study_id: Mapped[int | None] = mapped_column(ForeignKey("tuner_studies.id", ondelete="SET NULL"))
    finalizer_id: Mapped[str | None] = mapped_column(String(64))
    best_us: Mapped[float | None] = mapped_column(Double)
    best_config_json: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # distinct workers that gave it up for a local reason (TaskAttemptRow); at the limit the task fails
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # a verify task: the verification it recorded (revision 0009; NULL for tune tasks and those before)
    verification_id: Mapped[int | None] = mapped_column(
        ForeignKey("tuner_verifications.id", ondelete="SET NULL"))


class TaskAttemptRow(Base):
    """A worker that could not run a task for a reason of its own (mixed fleets): one row per worker."""

    __tablename__ = "tuner_task_attempts"
    __table_args__ = (UniqueConstraint("task_id", "worker_id"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tuner_tasks.id", ondelete="CASCADE"))
    worker_id: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class WorkerRow(Base):
    """A worker process bound to one device; its lease is renewed by heartbeat."""

    __tablename__ = "tuner_workers"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[str] = mapped_column(String(256))
    pid: Mapped[int] = mapped_column(Integer)
    device_kind: Mapped[str] = mapped_column(String(16))
    device_name: Mapped[str] = mapped_column(String(256))
    device_index: Mapped[int] = mapped_column(Integer, default=0)
    backends_json: Mapped[str] = mapped_column(Text)
    fingerprint_hash: Mapped[str] = mapped_column(String(64))
    fingerprint_json: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default="idle")
    current_task_id: Mapped[int | None] = mapped_column(ForeignKey("tuner_tasks.id", ondelete="SET NULL"))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_heartbeat: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    lease_expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    templates_json: Mapped[str | None] = mapped_column(Text)  # {name: version} it has; NULL: any template


class SlotRow(Base):
    """One trial of a task, reserved by a worker ('reserved') and completed with its measurement ('done').

    Slot ids are never reused (AUTOINCREMENT on SQLite, whose rowids otherwise reuse the largest id once its
    row is deleted): a worker reaped while cut off must not spend, with its old slot id, a slot reserved by
    another worker since."""

    __tablename__ = "tuner_slots"
    __table_args__ = (
        CheckConstraint("state IN ('reserved', 'done')", name="state"),
        Index("ix_tuner_slots_task_state", "task_id", "state"),
        Index("ix_tuner_slots_worker", "worker_id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tuner_tasks.id", ondelete="CASCADE"))
    worker_id: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), default="reserved")
    trial_number: Mapped[int | None] = mapped_column(Integer)
    measurement_id: Mapped[int | None] = mapped_column(ForeignKey("tuner_measurements.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
