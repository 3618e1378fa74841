"""The values the store contract speaks: frozen snapshots of stored rows, and the measurement to store.

Records never change and hold no session or connection; they stay valid after the call that produced them.
JSON columns are kept as the canonical JSON text they were stored as (``config_json`` equals
``tuner.frozen.Config.to_json()`` for the same config); the properties parse them on demand.
Timestamps are timezone-aware UTC.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal, Protocol

from tuner.errors import RecordConflictError
from tuner.results import COMPARATOR_PREFIX, DEFAULT_LABEL, Status, Timer

__all__ = [
    "ACTIVE_JOB_STATES", "COMPARATOR_PREFIX", "DEFAULT_LABEL", "OPEN_TASK_STATES", "ROLES", "VERIFIED_LABEL",
    "BestRecord", "Claim", "Claimant", "ClaimingWorker", "Disproval",
    "JobRecord", "MeasurementRecord", "NewMeasurement", "Status", "StudyRecord", "TaskAttemptRecord", "TaskRecord",
    "Timer", "WaitCause", "Waiting", "WorkerRecord", "advertises", "attempts_error", "canonical_json",
    "check_candidate", "check_disproval",
    "check_max_attempts", "check_role", "check_tasks", "claimable_tasks", "current_studies", "has_free_slot",
    "has_template",
    "is_live", "serves",
    "task_may_still_run", "waiting_reason", "wrong_processes",
]

VERIFIED_LABEL = "best"  # the label of the re-measured config among a verification's candidates
ROLES = ("trial", "final")  # a sweep trial, or a re-measurement in a final interleaved round
ACTIVE_JOB_STATES = ("queued", "running")  # a job's other states: done, failed, cancelled
OPEN_TASK_STATES = ("queued", "running")  # a task a worker may claim (not finalizing, done, failed, cancelled)
JsonInput = str | Mapping[str, Any]


def canonical_json(value: JsonInput, *, what: str) -> str:
    """Canonical JSON text (sorted keys, no spaces) of a mapping or of JSON text; ValueError if invalid.

    NaN and infinities are kept (Python's JSON extension): relative errors of NaN outputs are NaN.
    """
    if isinstance(value, str):
        try:
            data = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{what}: not valid JSON ({exc})") from exc
    else:
        data = value
    try:
        return json.dumps(data, sort_keys=True, separators=(",", ":"), default=_mapping_as_dict)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: cannot be stored as JSON ({exc})") from exc


def _mapping_as_dict(value: object) -> dict[str, Any]:
    if isinstance(value, Mapping):  # tuner.frozen maps (Shape, Config) are Mappings, not dicts
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def check_tasks(tasks: Sequence[tuple[str, str, str]]) -> None:
    """ValueError unless a job's ``(label, shape_key, shape_json)`` tasks are at least one, shapes distinct."""
    if not tasks:
        raise ValueError("a job needs at least one shape")
    keys = [key for _, key, _ in tasks]
    if len(set(keys)) != len(keys):
        raise ValueError("a job lists the same shape twice")


def attempts_error(attempts: Sequence[TaskAttemptRecord]) -> str:
    """The error of a task no worker could run: every worker that tried and its reason, oldest first."""
    reasons = "; ".join(f"{a.worker_id}: {a.reason}" for a in attempts)
    return f"could not run on {len(attempts)} worker(s): {reasons}"


def check_max_attempts(max_attempts: int) -> None:
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")


def is_live(worker: WorkerRecord, now: datetime) -> bool:
    """Registered, not stopped or declared lost, and within its lease."""
    return worker.state in ("idle", "busy") and worker.lease_expires_at >= now


class Claimant(Protocol):
    """What the claim rule reads of a worker: a :class:`WorkerRecord`, or a :class:`ClaimingWorker`."""

    @property
    def id(self) -> str: ...
    @property
    def device_kind(self) -> str: ...
    @property
    def device_name(self) -> str: ...
    @property
    def backends(self) -> Sequence[str]: ...
    @property
    def templates(self) -> Mapping[str, str] | None: ...


@dataclass(frozen=True)
class ClaimingWorker:
    """A worker as it asks for a task (``claim_task``): the device and backends it claims with, and the
    templates it advertised at registration (None: it advertised none, or is not registered; any template)."""

    id: str
    device_kind: str
    device_name: str
    backends: tuple[str, ...]
    templates: Mapping[str, str] | None


def advertises(worker: Claimant, job: JobRecord) -> bool:
    """The job's template at its version is among those the worker advertises (a worker that advertised none
    takes any template)."""
    return has_template(worker, job.template, job.template_version)


def has_template(worker: Claimant, template: str, version: str) -> bool:
    """``template`` at ``version`` is among those the worker advertises (one that advertised none: any)."""
    has = worker.templates
    return has is None or has.get(template) == version


def serves(worker: Claimant, job: JobRecord) -> bool:
    """The worker may claim the job's tasks: its device and a backend of the job's, and it advertises the
    job's template at its version (:func:`advertises`)."""
    return (worker.device_kind == job.device_kind and job.device_name in (None, worker.device_name)
            and job.backend in worker.backends and advertises(worker, job))


def has_free_slot(task: TaskRecord) -> bool:
    """A worker claiming the task would have work on it: a trial slot is free, or it has no trials (a verify
    job's task, until a worker takes its final step), or all its trials are done and nobody finalises it
    (it is running again: its finaliser was lost or gave it up)."""
    return (task.trials_reserved < task.trials_target or task.trials_target == 0
            or (task.state == "running" and task.trials_done >= task.trials_target))


def claimable_tasks(
    job: JobRecord, tasks: Sequence[TaskRecord], worker: Claimant, attempts: Iterable[TaskAttemptRecord],
) -> tuple[TaskRecord, ...]:
    """The tasks of ``job`` (``tasks``: its tasks, in their order) that ``worker`` could claim: the job is
    active (:data:`ACTIVE_JOB_STATES`), the task open (:data:`OPEN_TASK_STATES`) with a free slot
    (:func:`has_free_slot`), the worker serves the job (:func:`serves`: device, backend, advertised template
    at its version), and the worker has not given that task up (``attempts``: attempt records; those of other
    workers or tasks are ignored). A task given up does not bar the job's other tasks.

    This is the queue's claim rule, written once for the in-memory store (``MemoryStore.claim_task``) and the
    job page; the SQL store's ``db.jobs.claim_task`` states the same rule as a query: keep the two in step
    (``tests/store/test_store_contract.py`` checks that they agree). Pure, on the records given: which task a
    claim takes (highest priority, oldest job, first shape) is decided when it claims, on the rows then, so a
    slot free in these records may be taken by the time the worker asks."""
    if job.state not in ACTIVE_JOB_STATES or not serves(worker, job):
        return ()
    given_up = {a.task_id for a in attempts if a.worker_id == worker.id}
    return tuple(t for t in tasks
                 if t.state in OPEN_TASK_STATES and has_free_slot(t) and t.id not in given_up)


def task_may_still_run(
    task: TaskRecord, job: JobRecord, workers: Sequence[WorkerRecord], attempts: Sequence[TaskAttemptRecord],
    slot_holders: Collection[str], now: datetime,
) -> bool:
    """Some live worker is on the task (holds a trial slot of it, works on it, finalises it) or may still
    claim it (it serves the job and has not given this task up)."""
    tried = {a.worker_id for a in attempts}
    for worker in workers:
        if not is_live(worker, now):
            continue
        on_it = worker.id in slot_holders or worker.id == task.finalizer_id or (
            worker.state == "busy" and worker.current_task_id == task.id)
        if on_it or (worker.id not in tried and serves(worker, job)):
            return True
    return False


WaitCause = Literal["no_template", "no_device", "gave_up"]  # Waiting.cause


@dataclass(frozen=True)
class Waiting:
    """Why an active job waits with no worker on it. ``cause``: ``no_template`` (no live worker advertises
    its template and version), ``no_device`` (some do, but none of its device and backend), ``gave_up``
    (every live worker that could take a task of it gave the task up); ``text``: the same for its user, with
    the names and the workers' reasons. Immutable."""

    cause: WaitCause
    text: str


def waiting_reason(
    job: JobRecord, workers: Sequence[WorkerRecord], attempts: Mapping[int, Sequence[TaskAttemptRecord]],
    now: datetime,
) -> Waiting | None:
    """Why an active job waits with no worker on it; None when it does not (finished, or a live worker is
    on it or may take it). ``attempts`` lists the attempts of each task by task id. Pure."""
    if job.state not in ACTIVE_JOB_STATES or job.workers:
        return None
    live = [w for w in workers if is_live(w, now)]
    wanted = f"{job.template} version {job.template_version}"
    if not any(advertises(w, job) for w in live):
        return Waiting("no_template", f"no live worker advertises {wanted}")
    capable = [w for w in live if serves(w, job)]
    if not capable:
        name = job.device_name or "any"
        return Waiting("no_device", f"no live worker of device {job.device_kind}:{name} with backend "
                                    f"{job.backend} advertises {wanted}")
    open_tasks = [t for t in job.tasks if t.state in OPEN_TASK_STATES]
    for task in open_tasks:
        tried = {a.worker_id for a in attempts.get(task.id, ())}
        if all(w.id in tried for w in capable):
            # Only the live workers' reasons: a stopped worker's (its device gone) no longer holds the job.
            ids = {w.id for w in capable}
            reasons = "; ".join(f"{a.worker_id}: {a.reason}" for a in attempts.get(task.id, ()) if a.worker_id in ids)
            return Waiting("gave_up", f"every live worker gave {task.label} up: {reasons}")
    return None


JOB_KINDS = ("tune", "verify")


def check_job_kind(kind: str, trials: int, processes: int | None, comparator_processes: int | None = None) -> None:
    """ValueError unless ``kind`` is a job kind, a tuning job has trials (and no ``comparator_processes``), and
    a verify job has no trials, at least one process per shape and ``comparator_processes`` None (comparators
    in every process) or between 1 and ``processes``."""
    if kind not in JOB_KINDS:
        raise ValueError(f"unknown job kind {kind!r}; known: {', '.join(JOB_KINDS)}")
    if kind == "tune" and trials < 1:
        raise ValueError("a tuning job needs at least one trial per shape")
    if kind == "tune" and comparator_processes is not None:
        raise ValueError("comparator_processes applies to verify jobs only")
    if kind != "verify":
        return
    if trials != 0 or processes is None or processes < 1:
        raise ValueError("a verify job has no trials and at least one process per shape")
    if comparator_processes is not None and not 1 <= comparator_processes <= processes:
        raise ValueError(f"comparator_processes must be between 1 and processes ({processes}), "
                         f"got {comparator_processes}")


def check_role(role: str) -> None:
    """ValueError unless ``role`` is one of ROLES."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")


def check_candidate(candidate: str) -> None:
    """ValueError unless ``candidate`` is 'config', 'default' or 'comparator:<name>'."""
    if candidate in ("config", "default"):
        return
    if candidate.startswith("comparator:") and len(candidate) > len("comparator:"):
        return
    raise ValueError(f"candidate must be 'config', 'default' or 'comparator:<name>'; got {candidate!r}")


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
    device_index: int | None = None
    device_uuid: str | None = None

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
    attempts: int = 0  # distinct workers that could not run it for a local reason (see TaskAttemptRecord)
    verification_id: int | None = None  # a verify task: the verification it recorded (None: none, or a tune task)

    @property
    def shape(self) -> dict[str, Any]:
        return dict(json.loads(self.shape_json))


@dataclass(frozen=True)
class TaskAttemptRecord:
    """A worker that claimed a task and could not run it for a reason of its own (its template missing or
    not importable, another template version, its device failing): the task went back to the others."""

    task_id: int
    worker_id: str
    reason: str
    created_at: datetime


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
    kind: str = "tune"  # 'tune' | 'verify'
    processes: int | None = None  # fresh processes per shape of a verify job
    comparator_processes: int | None = None  # verify job: comparators in the first N processes only (None: all)
    max_attempts: int = 3  # distinct workers that may give a task up before it may fail (set at submission)
    idempotency_key: str | None = None  # the submitter's key: a request repeated with it finds this job
    request_hash: str | None = None  # of the request that created it: the same key with another request conflicts

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
    templates_json: str | None = None  # {name: version} it advertised; None: not advertised (any template)

    @property
    def backends(self) -> list[str]:
        return list(json.loads(self.backends_json))

    @property
    def templates(self) -> dict[str, str] | None:
        """The templates it has, name → version, as advertised at registration; None when it advertised
        none (a worker of an older tuner): it may claim any template."""
        return None if self.templates_json is None else dict(json.loads(self.templates_json))


@dataclass(frozen=True)
class Claim:
    """A task a worker claimed, with its job."""

    job: JobRecord
    task: TaskRecord


def repeated(job: JobRecord, idempotency_key: str, request_hash: str | None) -> JobRecord:
    """The job a submission repeated under ``idempotency_key`` finds: ``job`` (the one created under that key)
    when it was created by the same request (``request_hash``), else RecordConflictError: a key names one
    request. Pure."""
    if job.request_hash != request_hash:
        raise RecordConflictError(f"idempotency key {idempotency_key!r} was used for another request (job "
                                  f"{job.id}): send a new key with a new request")
    return job


@dataclass(frozen=True)
class RoundHold:
    """A worker's hold on a task's final round (:meth:`tuner.store.JobQueue.begin_finalize`), which a publish
    may require (:meth:`tuner.store.TuningStore.publish_unless_disproved`). Immutable."""

    task_id: int
    worker_id: str


def storable_text(text: str | None) -> str | None:
    """Free text (a failure's reason) as every store keeps it: a NUL, which PostgreSQL's text refuses, and
    characters UTF-8 cannot encode (lone surrogates, from bytes decoded with ``surrogateescape``) written as
    backslash escapes. A compiler's message must not make its measurement unstorable: the refusal
    (RecordRejectedError, the caller's input) would fail the task on every worker. Pure."""
    if text is None:
        return None
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


@dataclass(frozen=True)
class NewMeasurement:
    """One measurement to store (plain values: the store knows no engine types). Immutable.

    ``role`` is 'trial' or 'final'; ``candidate`` 'config', 'default' or 'comparator:<name>'; JSON fields are
    JSON text or mappings (stored canonically: sorted keys, no spaces). Times are µs, phases seconds.
    ``reason`` is kept as :func:`storable_text` writes it.
    """

    study_id: int
    role: str
    candidate: str
    config_json: JsonInput
    status: Status | str
    round_id: str | None = None
    trial_number: int | None = None
    reason: str | None = None
    errors_json: JsonInput = "{}"
    kernels_json: JsonInput = "{}"
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    mean_us: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    n_samples: int | None = None
    timer: Timer | str | None = None
    build_s: float | None = None
    verify_s: float | None = None
    measure_s: float | None = None
    worker: str | None = None
    device_index: int | None = None  # the measuring device's index on its host
    device_uuid: str | None = None  # the GPU's UUID, where the backend knows it

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", storable_text(self.reason))


@dataclass(frozen=True)
class VerificationRecord:
    """A published best re-measured in fresh processes: the figures, the drift against the stored median,
    and where it ran (the re-measuring device's fingerprint, which may differ from the study's)."""

    id: int
    study_id: int
    config_json: str
    stored_us: float
    median_us: float | None
    low_us: float | None
    high_us: float | None
    drift: float | None
    tolerance: float
    flagged: bool
    processes: int
    figures_json: str
    device_kind: str
    device_name: str
    fingerprint_hash: str
    fingerprint_json: str
    worker: str | None
    created_at: datetime

    @property
    def config(self) -> dict[str, Any]:
        return dict(json.loads(self.config_json))

    def of_config(self, config: Mapping[str, Any] | str | None) -> VerificationRecord | None:
        """This verification if it re-measured ``config`` (a dict or its JSON), else None. A study's latest
        verification is of the best published when it ran; a later sweep of the same study may publish
        another best, which that verification says nothing about."""
        if config is None:
            return None
        wanted = json.loads(config) if isinstance(config, str) else dict(config)
        return self if self.config == wanted else None

    @property
    def figures(self) -> list[dict[str, Any]]:
        """Per process: ``{"process": i, "candidates": [{"label", "status", "median_us", "p20_us", "p80_us",
        "stored_us", "reason"[, "kernels"]}, …]}`` (``kernels``: device activity name -> median µs, where the
        backend tells kernels apart: CUPTI; verifications since 2026-12-04)."""
        return list(json.loads(self.figures_json))

    @property
    def wrong_processes(self) -> int:
        """Fresh processes in which the re-measured config failed its correctness check (WRONG_RESULT on
        their inputs): above zero, the verification disproved it (see :func:`tuner.driver.reverify.verify_best`)."""
        return wrong_processes(self.figures)


def wrong_processes(figures: Iterable[Mapping[str, Any]]) -> int:
    """:attr:`VerificationRecord.wrong_processes` of a verification's per-process ``figures``. Pure."""
    return sum(
        1 for p in figures for c in p.get("candidates", ())
        if c.get("label") == VERIFIED_LABEL and c.get("status") == Status.WRONG_RESULT.value
    )


@dataclass(frozen=True)
class Disproval:
    """What :meth:`tuner.store.TuningStore.record_disproval` stored in its one transaction: the verification,
    and the best published in the disproved one's place (None: none) or whether the best was withdrawn (at
    most one of the two). Immutable."""

    verification: VerificationRecord
    replacement: BestRecord | None = None
    withdrawn: bool = False


def check_disproval(
    *, best_measurement_id: int | None, stand_in_id: int | None, withdraw: bool,
    figures: Sequence[Mapping[str, Any]], device_name: str, study_device_name: str,
) -> None:
    """The checks of :meth:`tuner.store.TuningStore.record_disproval` that need no stored row but the study's
    device name: ValueError for a stand-in and a withdrawal both, either without the best they act on, or
    either for a verification whose figures hold no wrong process; RecordConflictError for either on a
    verification on another device name than the study's (it disproves nothing: another GPU's numerics)."""
    if stand_in_id is None and not withdraw:
        return
    if stand_in_id is not None and withdraw:
        raise ValueError("a disproved best is either replaced by a stand-in or withdrawn, not both")
    if best_measurement_id is None:
        raise ValueError("a stand-in or a withdrawal acts on a published best: best_measurement_id is missing")
    if not wrong_processes(figures):
        raise ValueError("the verification found no wrong result: it disproves nothing")
    if device_name != study_device_name:
        raise RecordConflictError(
            f"a verification on {device_name} disproves nothing of a study measured on {study_device_name}")


SESSION_GAP_S = 300.0  # trials further apart than this belong to separate runs of the search


def current_studies(
    studies: Iterable[StudyRecord], bests: Iterable[BestRecord]
) -> dict[tuple[str, str, str], StudyRecord]:
    """The study each (shape key, device kind, device name) is shown by (``tuner report``, the template page):
    the one whose best config was published last, else, among studies that published none, the newest. A
    shape has several studies when it was tuned under several fingerprints (software versions); a study whose
    sweep ended without publishing (stopped, nothing passed) does not hide one that did. The row then shows
    that study's latest final round, which is the published one unless a later round of it published
    nothing. Pure."""
    published = {b.study_id: b.published_at for b in bests}

    def rank(st: StudyRecord) -> tuple[bool, datetime, int]:
        at = published.get(st.id)
        return (at is not None, at or datetime.min.replace(tzinfo=timezone.utc), st.id)

    chosen: dict[tuple[str, str, str], StudyRecord] = {}
    for st in studies:
        k = (st.shape_key, st.device_kind, st.device_name)
        if k not in chosen or rank(st) > rank(chosen[k]):
            chosen[k] = st
    return chosen


def active_seconds(stamps: Sequence[datetime]) -> float | None:
    """Wall time a search ran, from its trials' times: the sum of the gaps between consecutive trials,
    leaving out gaps longer than SESSION_GAP_S (the search was resumed later, e.g. in another session).
    None for fewer than two trials."""
    if len(stamps) < 2:
        return None
    ordered = sorted(stamps)
    gaps = ((b - a).total_seconds() for a, b in itertools.pairwise(ordered))
    return sum(g for g in gaps if g <= SESSION_GAP_S)
