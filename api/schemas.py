"""Request and response bodies of the API (pydantic v2). Requests forbid unknown fields; bounds are enforced
here so that a bad body is refused with field-level messages before anything touches the store.

Requests are strict: numbers must be JSON numbers (``"40"`` is not a trial count), booleans JSON booleans,
and finite (``NaN``/``Infinity`` are refused); text holds no NUL byte and no lone surrogate (neither can be
stored in PostgreSQL, nor encoded in an answer) and fits the column it is stored in. Shape dim values are
typed by the template (its ``make_shape``), so a dim value may be a number, a boolean or a string there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tuner.driver.sampler_names import SamplerName
from tuner.store import JobRecord, MeasurementRecord, TaskAttemptRecord, TaskRecord
from tuner.store.records import WaitCause, Waiting

DeviceKind = Literal["cuda", "npu", "cpu"]
JobState = Literal["queued", "running", "done", "failed", "cancelled"]
JobKind = Literal["tune", "verify"]
MAX_TRIALS = 100_000
MAX_SHAPES = 256
MAX_ID = 2**63 - 1  # ids are 64-bit in every backend: a larger one cannot exist (422, not a store error)
MAX_OFFSET = 2**63 - 1


def storable(text: str) -> str:
    """``text`` unchanged; ValueError when it holds a NUL byte or a lone surrogate (not storable as text)."""
    if "\x00" in text:
        raise ValueError("text must not contain NUL bytes")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return text


Storable = AfterValidator(storable)
Name = Annotated[str, StringConstraints(min_length=1, max_length=128), Storable]  # template, workload
DimName = Annotated[str, StringConstraints(min_length=1, max_length=64), Storable]
DeviceName = Annotated[str, StringConstraints(min_length=1, max_length=256), Storable]
DimText = Annotated[str, StringConstraints(max_length=256), Storable]
DimValue = int | bool | DimText


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class DeviceRequirement(_Request):
    """The device a job's workers must have: ``{"kind": "cuda", "name": "NVIDIA H200"}``, or its kind alone as
    a string (``"cuda"``: any device of the kind), the form ``GET /v1/best``'s ``device`` takes."""

    kind: DeviceKind = Field(description="Device kind a worker must have.")
    name: DeviceName | None = Field(
        default=None,
        description='Device name a worker must report, e.g. "NVIDIA H200" (default: any device of the kind).',
    )

    @model_validator(mode="before")
    @classmethod
    def _kind_alone(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value


class JobIn(_Request):
    """A job: one task per shape (named workloads and explicit shapes, duplicates merged). ``kind`` "tune"
    (default) sweeps and publishes; "verify" re-measures each shape's published best and the comparators in
    ``processes`` fresh processes and records the drift (``tuner verify`` on a worker; trials, sampler, seed
    and finalists do not apply); ``comparator_processes`` limits the comparators to the first N of them (a
    verify job's only; at most ``processes``; dropped when ``comparators`` is false)."""

    kind: JobKind = Field(default="tune", description="tune: sweep and publish; verify: re-measure the best.")
    template: Name = Field(description="Registered template name.")
    workloads: list[Name] = Field(
        default_factory=list, max_length=MAX_SHAPES, description="Named workloads."
    )
    shapes: list[dict[DimName, DimValue]] = Field(
        default_factory=list, max_length=MAX_SHAPES, description="Explicit shapes, dim name → value."
    )
    device: DeviceRequirement
    trials: int = Field(default=40, ge=1, le=MAX_TRIALS, description="Measured trials per shape.")
    sampler: SamplerName = "tpe"
    candidate_timeout_s: float = Field(default=120.0, ge=1.0, le=3600.0, description="Seconds per candidate.")
    samples: int = Field(default=100, ge=1, le=10_000, description="Timed samples per candidate.")
    finalists: int = Field(default=3, ge=1, le=50, description="Configs re-measured in the final round.")
    comparators: bool = Field(default=True, description="Measure the template's comparators in the final round.")
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1, description="Sampler seed.")
    priority: int = Field(default=0, ge=-1000, le=1000, description="Higher runs first.")
    processes: int = Field(default=5, ge=1, le=50, description="verify jobs: fresh processes per shape.")
    # after ``kind`` and ``processes``: its validator reads them
    comparator_processes: int | None = Field(
        default=None, ge=1, le=50,
        description="verify jobs: re-measure the comparators in the first N processes only (1..processes; "
                    "default: every process), for a comparator that compiles for minutes in each new process.")

    @field_validator("comparator_processes")
    @classmethod
    def _within_processes(cls, value: int | None, info: ValidationInfo) -> int | None:
        """A verify job's only, and at most ``processes`` (a field-level 422; nothing reaches the store); without
        comparators it limits nothing and is dropped (as ``tuner verify --no-comparators`` ignores it)."""
        if value is None:
            return None
        if info.data.get("kind", "verify") != "verify":  # (absent: the kind was refused already)
            raise ValueError("comparator_processes applies to verify jobs only (\"kind\": \"verify\")")
        if info.data.get("comparators") is False:
            return None
        processes = info.data.get("processes")
        if processes is not None and value > processes:
            raise ValueError(f"comparator_processes ({value}) must be at most processes ({processes})")
        return value


class VerificationOut(BaseModel):
    """The latest re-measurement of a published best in fresh processes (``tuner verify``)."""

    verified_at: str
    median_us: float | None = Field(description="Median over the processes of the config's medians (µs).")
    stored_us: float = Field(description="The published median it was checked against (µs).")
    drift: float | None = Field(description="median_us / stored_us - 1 (None: no process measured it OK).")
    tolerance: float
    flagged: bool = Field(description="Drift beyond ±tolerance, no process measured it OK, or a wrong result.")
    processes: int
    wrong_processes: int = Field(0, description="Processes in which the config failed its correctness check.")
    device_name: str = Field(description="The device it was re-measured on.")
    fingerprint: str = Field(description="The software fingerprint it was re-measured under.")


class TaskVerificationOut(VerificationOut):
    """What a verify job's task found: the verification it recorded (``tuner verify`` on its worker). A wrong
    result on another device name than the best's study ends the task done; this says so."""

    id: int
    study_id: int = Field(description="The study whose published best was re-measured.")
    config: dict[str, Any] = Field(description="The config re-measured (the published best).")
    verdict: Literal["right", "drifted", "wrong", "not measured"] = Field(description=(
        "right: within tolerance; drifted: beyond it; wrong: a wrong result in some process; not measured: "
        "no process measured it OK (and none found it wrong)."))
    reason: str | None = Field(description="The first failing process's reason (e.g. the error against the "
                                           "reference for a wrong result); null when every process ran OK.")
    summary: str = Field(description="The verdict in a sentence, with the device and the figures.")


class AttemptOut(BaseModel):
    """A worker that gave the task up (its device failed on it), and why."""

    worker_id: str
    reason: str
    at: datetime


class TaskOut(BaseModel):
    id: int
    label: str
    shape: dict[str, Any]
    state: str
    trials_done: int
    trials_failed: int
    trials_total: int
    best_us: float | None = Field(description="Best median time so far (µs).")
    best_config: dict[str, Any] | None
    study_id: int | None
    error: str | None
    attempts: int = Field(default=0, description="Distinct workers that gave the task up (their device failed "
                                                 "on it); it fails once the job's max_attempts did and no live "
                                                 "worker is on it or may still take it.")
    attempt_reasons: list[AttemptOut] = Field(default_factory=list, description="Who gave it up and why, "
                                                                                "oldest first.")
    verification: TaskVerificationOut | None = Field(default=None, description=(
        "A verify task: what the verification it recorded found (null: a tuning task, or not verified yet)."))

    @classmethod
    def of(cls, task: TaskRecord, attempts: Sequence[TaskAttemptRecord] = (),
           verification: TaskVerificationOut | None = None) -> TaskOut:
        return cls(
            id=task.id, label=task.label, shape=task.shape, state=task.state, trials_done=task.trials_done,
            trials_failed=task.trials_failed, trials_total=task.trials_target, best_us=task.best_us,
            best_config=json.loads(task.best_config_json) if task.best_config_json else None,
            study_id=task.study_id, error=task.error, attempts=task.attempts,
            attempt_reasons=[AttemptOut(worker_id=a.worker_id, reason=a.reason, at=a.created_at) for a in attempts],
            verification=verification,
        )


class Progress(BaseModel):
    trials_done: int
    trials_total: int


class JobOut(BaseModel):
    id: int
    kind: JobKind = "tune"
    processes: int | None = Field(default=None, description="verify jobs: fresh processes per shape.")
    comparator_processes: int | None = Field(default=None, description="verify jobs: the comparators are "
                                                                       "re-measured in the first N processes "
                                                                       "only (null: in every process).")
    state: JobState
    template: str
    template_version: str
    backend: str
    device: DeviceRequirement
    trials: int
    sampler: str
    seed: int | None
    samples: int
    candidate_timeout_s: float
    finalists: int
    comparators: bool
    priority: int
    error: str | None
    submitted_by: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    progress: Progress
    tasks: list[TaskOut] = Field(description="One per shape, with its progress and best so far.")
    workers: list[str] = Field(description="Ids of the workers on the job now.")
    max_attempts: int = Field(default=3, description="Distinct workers that must give a task up before it may "
                                                     "fail (the server's TUNER_TASK_ATTEMPTS at submission).")
    waiting: str | None = Field(default=None, description="Why a queued or running job waits with no worker on "
                                                          "it: no live worker advertises its template and "
                                                          "version (or none of its device and backend does), or "
                                                          "every live worker that could gave a task up (with "
                                                          "their reasons). Null otherwise.")
    waiting_cause: WaitCause | None = Field(
        default=None, description="What ``waiting`` says, for programs: no_template (no live worker advertises "
                                  "the template and version), no_device (none of the job's device and backend "
                                  "does), gave_up (every live worker that could gave a task up). Null when "
                                  "``waiting`` is.")

    @classmethod
    def of(
        cls, job: JobRecord, attempts: Mapping[int, Sequence[TaskAttemptRecord]] | None = None,
        waiting: Waiting | None = None, verifications: Mapping[int, TaskVerificationOut] | None = None,
    ) -> JobOut:
        attempts, verifications = attempts or {}, verifications or {}
        return cls(
            id=job.id, kind=job.kind, processes=job.processes,  # type: ignore[arg-type]
            comparator_processes=job.comparator_processes,
            state=job.state, template=job.template,  # type: ignore[arg-type]
            template_version=job.template_version, backend=job.backend,
            device=DeviceRequirement(kind=job.device_kind, name=job.device_name),  # type: ignore[arg-type]
            trials=job.trials, sampler=job.sampler, seed=job.seed, samples=job.samples,
            candidate_timeout_s=job.candidate_timeout_s, finalists=job.finalists, comparators=job.comparators,
            priority=job.priority, error=job.error, submitted_by=job.submitted_by, created_at=job.created_at,
            updated_at=job.updated_at, finished_at=job.finished_at,
            progress=Progress(trials_done=job.trials_done, trials_total=job.trials_total),
            tasks=[TaskOut.of(t, attempts.get(t.id, ()), verifications.get(t.id)) for t in job.tasks],
            workers=list(job.workers), max_attempts=job.max_attempts,
            waiting=None if waiting is None else waiting.text, waiting_cause=None if waiting is None else waiting.cause,
        )


class Page(BaseModel):
    total: int
    limit: int
    offset: int


class JobPage(Page):
    items: list[JobOut]


class DifferenceOut(BaseModel):
    """One thing that differs between the request and the entry whose config is served."""

    what: str = Field(description="shape.<dim>, device_name, template_version, or a software field "
                                  "(driver, runtime, torch, triton, tilelang…).")
    requested: Any
    entry: Any = Field(description="The entry's value (null: unknown — not recorded with the entry).")


class ConfigChangeOut(BaseModel):
    """One parameter of the entry's config changed to make it valid for the requested shape (a repair)."""

    param: str
    entry: Any = Field(description="The value in the entry's config (invalid for the requested shape).")
    served: Any = Field(description="The value served in ``config``.")


class BestOut(BaseModel):
    """The config to use for a shape, and why (``match``)."""

    template: str
    template_version: str
    shape: dict[str, Any] = Field(description="The requested shape, completed with the template's defaults.")
    shape_key: str
    device_kind: DeviceKind
    device_name: str | None = Field(description="Device the config was measured on (None for the default).")
    match: Literal["exact", "nearest", "default"]
    distance: float | None = Field(description="Shape distance to the measured shape (0 exact, None default).")
    config: dict[str, Any]
    median_us: float | None
    p20_us: float | None
    p80_us: float | None
    n_samples: int | None
    timer: str | None
    measurement_id: int | None = Field(description="The trial (measurement) the config comes from.")
    fingerprint: str | None
    published_at: str | None
    source_shape: dict[str, Any] | None = Field(description="The shape the config was measured for.")
    software: dict[str, str] | None = Field(
        default=None, description="Driver, runtime and library versions the config was verified under.")
    differences: list[DifferenceOut] = Field(
        default_factory=list, description="What differs from the request (empty for an exact match).")
    unchecked: list[str] = Field(
        default_factory=list, description="Fields the request did not give (device_name, software), hence not "
                                          "compared: an exact match says nothing about them.")
    repaired: list[ConfigChangeOut] = Field(default_factory=list, description=(
        "Parameters changed from the entry's config because it breaks the template's constraints for the "
        "requested shape (the smallest valid change, see the README's lookup); empty: served as measured. "
        "median_us and the other figures are those of the entry's own config."))
    measured_version: str | None = Field(default=None, description=(
        "The template version the served entry was measured under (None for the default): an earlier one "
        "than template_version when the current version has no best of its own here yet and carries that "
        "version's (its config completed with the parameters the current version added)."))
    notes: list[str]
    stale: bool = Field(default=False, description=(
        "true: the store is unreachable and this is the last answer computed (also the header x-stale: true)"))
    verification: VerificationOut | None = Field(
        default=None, description="The entry's latest verification; a drift beyond tolerance is flagged.")


class DimOut(BaseModel):
    name: str
    kind: str
    default: int | bool | float | str | None
    choices: list[str] | None
    minimum: int | None
    maximum: int | None
    doc: str


class ParamOut(BaseModel):
    name: str
    kind: str
    choices: list[Any]
    doc: str


class ConstraintOut(BaseModel):
    expr: str
    reason: str


class WorkloadOut(BaseModel):
    name: str
    shape: dict[str, Any]
    doc: str


class TemplateOut(BaseModel):
    name: str
    version: str
    backend: str
    doc: str
    dims: list[DimOut]
    parameters: list[ParamOut]
    constraints: list[ConstraintOut]
    default: dict[str, Any]
    workloads: list[WorkloadOut]
    max_elements: int = Field(description="Largest shape accepted: bound on the product of its int dims.")


class MeasurementOut(BaseModel):
    id: int
    study_id: int
    role: str
    trial_number: int | None
    candidate: str
    config: dict[str, Any]
    status: str
    reason: str | None
    median_us: float | None
    p20_us: float | None
    p80_us: float | None
    n_samples: int | None
    timer: str | None
    kernels: dict[str, float]  # device time per kernel, median µs per sample (CUPTI measurements)
    worker: str | None
    created_at: datetime

    @classmethod
    def of(cls, m: MeasurementRecord) -> MeasurementOut:
        return cls(
            id=m.id, study_id=m.study_id, role=m.role, trial_number=m.trial_number, candidate=m.candidate,
            config=m.config, status=m.status.value, reason=m.reason, median_us=m.median_us, p20_us=m.p20_us,
            p80_us=m.p80_us, n_samples=m.n_samples, timer=m.timer, kernels=m.kernels, worker=m.worker,
            created_at=m.created_at,
        )


class StudyOut(BaseModel):
    id: int
    name: str
    template_version: str
    device_kind: str
    device_name: str
    fingerprint: str
    created_at: datetime


class HistoryPage(Page):
    study: StudyOut = Field(description="The study listed (the newest one of the shape and device).")
    studies: list[StudyOut] = Field(description="Every study of the shape and device (pick one with study_id).")
    items: list[MeasurementOut]


class WorkerOut(BaseModel):
    id: str
    host: str
    pid: int
    device_kind: str
    device_name: str
    device_index: int
    backends: list[str]
    fingerprint: str
    state: Literal["idle", "busy", "stopped", "lost"] = Field(
        description="'lost' also when the stored state is idle/busy but the lease has expired."
    )
    lease_expired: bool
    last_heartbeat: datetime
    lease_expires_at: datetime
    started_at: datetime
    current_task_id: int | None
    current_job_id: int | None
    templates: dict[str, str] | None = Field(default=None, description="The templates it advertises, name → "
                                                                       "version: it claims only jobs of those "
                                                                       "(null: a worker of an older tuner, any "
                                                                       "template).")


class RegretRowOut(BaseModel):
    """One held-out shape: what the lookup would serve without its own entry, and what that loses."""

    shape: dict[str, Any]
    match: Literal["nearest", "default", "none"]
    source_shape: dict[str, Any] | None = Field(description="The shape whose entry would be served.")
    distance: float | None
    config: dict[str, Any] | None
    best_us: float = Field(description="The shape's own published best (µs).")
    regret: float | None = Field(description="Served / own best − 1 (0.05: 5% slower); null when the shape's "
                                             "records never measured the served config.")
    basis: Literal["own best", "final round", "trials"] | None
    repaired: list[ConfigChangeOut] = Field(
        default_factory=list, description="Parameters the lookup changed from the source entry's config, "
                                          "invalid for this shape (empty: served as measured).")


class RegretOut(BaseModel):
    """Leave-one-out nearest-shape regret of one template version on one device (see `tuner regret`)."""

    template: str
    template_version: str
    device_kind: str
    device_name: str
    distance: str
    shapes: int
    measured: int
    unmeasured: int
    median: float | None
    p90: float | None
    worst: float | None
    rows: list[RegretRowOut]
    notes: list[str]
