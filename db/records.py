"""What the repository returns: frozen, ORM-free snapshots of stored rows.

Records never change and hold no session; they stay valid after the session that produced them ends.
JSON columns are kept as the canonical JSON text they were stored as (``config_json`` equals
``tuner.frozen.Config.to_json()`` for the same config); the properties parse them on demand.
Timestamps are timezone-aware UTC.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tuner.results import Status


@dataclass(frozen=True)
class StudyRecord:
    id: int
    name: str  # the Optuna study name (tuner.keys.StudyKey.study_name())
    template: str
    template_version: str
    shape_key: str
    shape_json: str
    device_kind: str
    device_name: str
    fingerprint_hash: str
    fingerprint_json: str
    created_at: datetime

    @property
    def shape(self) -> dict[str, Any]:
        return dict(json.loads(self.shape_json))


@dataclass(frozen=True)
class MeasurementRecord:
    id: int
    study_id: int
    role: str  # 'trial' | 'final'
    round_id: str | None
    candidate: str  # 'config' | 'default' | 'comparator:<name>'
    trial_number: int | None
    config_json: str
    status: Status
    reason: str | None
    errors_json: str
    kernels_json: str
    median_us: float | None
    p20_us: float | None
    p80_us: float | None
    mean_us: float | None
    min_us: float | None
    max_us: float | None
    n_samples: int | None
    timer: str | None
    build_s: float | None
    verify_s: float | None
    measure_s: float | None
    worker: str | None
    created_at: datetime

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def config(self) -> dict[str, Any]:
        return dict(json.loads(self.config_json))

    @property
    def errors(self) -> dict[str, float]:
        """Relative L2 error per output (NaN where an output was NaN)."""
        return {name: float(value) for name, value in json.loads(self.errors_json).items()}

    @property
    def kernels(self) -> dict[str, float]:
        """Median µs per sample of each device activity (empty where the timer does not see kernels)."""
        return {name: float(value) for name, value in json.loads(self.kernels_json).items()}


@dataclass(frozen=True)
class BestRecord:
    id: int
    study_id: int
    measurement_id: int
    config_json: str
    median_us: float
    p20_us: float | None
    p80_us: float | None
    n_samples: int | None
    timer: str | None
    template: str
    template_version: str
    shape_key: str
    shape_json: str
    device_kind: str
    device_name: str
    fingerprint_hash: str
    published_at: datetime

    @property
    def config(self) -> dict[str, Any]:
        return dict(json.loads(self.config_json))

    @property
    def shape(self) -> dict[str, Any]:
        return dict(json.loads(self.shape_json))


@dataclass(frozen=True)
class TaskRecord:
    """One shape of a job, with its trial counts (done ≤ reserved ≤ target)."""

    id: int
    job_id: int
    position: int
    label: str
    shape_key: str
    shape_json: str
    state: str
    trials_target: int
    trials_reserved: int
    trials_done: int
    trials_failed: int
    study_id: int | None
    finalizer_id: str | None
    best_us: float | None
    best_config_json: str | None
    error: str | None
    updated_at: datetime

    @property
    def shape(self) -> dict[str, Any]:
        return dict(json.loads(self.shape_json))


@dataclass(frozen=True)
class JobRecord:
    """A job with its tasks (in submission order) and the ids of the workers on it now."""

    id: int
    template: str
    template_version: str
    backend: str
    device_kind: str
    device_name: str | None
    trials: int
    sampler: str
    seed: int | None
    samples: int
    candidate_timeout_s: float
    finalists: int
    comparators: bool
    priority: int
    state: str
    error: str | None
    submitted_by: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    tasks: tuple[TaskRecord, ...] = ()
    workers: tuple[str, ...] = ()

    @property
    def trials_done(self) -> int:
        return sum(t.trials_done for t in self.tasks)

    @property
    def trials_total(self) -> int:
        return sum(t.trials_target for t in self.tasks)


@dataclass(frozen=True)
class WorkerRecord:
    id: str
    host: str
    pid: int
    device_kind: str
    device_name: str
    device_index: int
    backends_json: str
    fingerprint_hash: str
    fingerprint_json: str
    state: str
    current_task_id: int | None
    started_at: datetime
    last_heartbeat: datetime
    lease_expires_at: datetime

    @property
    def backends(self) -> list[str]:
        return list(json.loads(self.backends_json))
