"""The store protocols in memory: for unit tests and one-process demos.

:class:`MemoryStore` keeps every record in dictionaries behind one lock (thread-safe within a process;
nothing is shared with other processes or survives it). It follows the same contract as the SQL store,
checked by the same suite (``tests/store/test_store_contract.py``). Its Optuna side is one
``InMemoryStorage`` (without trial heartbeats, which need a database).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from tuner.errors import NotFoundError, RecordConflictError, SlotLostError
from tuner.store.protocols import ORDERS, TrialHeartbeats
from tuner.store.records import (
    ACTIVE_JOB_STATES,
    COMPARATOR_PREFIX,
    DEFAULT_LABEL,
    OPEN_TASK_STATES,
    BestRecord,
    Claim,
    ClaimingWorker,
    Disproval,
    JobRecord,
    JsonInput,
    MeasurementRecord,
    NewMeasurement,
    RoundHold,
    Status,
    StudyRecord,
    TaskAttemptRecord,
    TaskRecord,
    Timer,
    VerificationRecord,
    WorkerRecord,
    attempts_error,
    canonical_json,
    check_candidate,
    check_disproval,
    check_job_kind,
    check_max_attempts,
    check_role,
    check_tasks,
    claimable_tasks,
    storable_text,
    task_may_still_run,
)

if TYPE_CHECKING:
    import optuna

FINISHED_JOB_STATES = ("done", "failed", "cancelled")
_KEY_FIELDS = ("template", "template_version", "shape_key", "device_kind", "device_name", "fingerprint_hash")


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclasses.dataclass
class _Slot:
    id: int
    task_id: int
    worker_id: str
    state: str  # reserved | done
    measurement_id: int | None = None  # done: the measurement it was spent on


class MemoryStore:
    """:class:`tuner.store.TuningStore` and :class:`tuner.store.JobQueue` in this process's memory."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._studies: dict[int, StudyRecord] = {}
        self._measurements: dict[int, MeasurementRecord] = {}
        self._best: dict[int, BestRecord] = {}  # by study id
        self._jobs: dict[int, JobRecord] = {}  # tasks kept apart: see _job
        self._tasks: dict[int, TaskRecord] = {}
        self._slots: dict[int, _Slot] = {}
        self._workers: dict[str, WorkerRecord] = {}
        self._verifications: list[VerificationRecord] = []
        self._attempts: list[TaskAttemptRecord] = []
        self._optuna: optuna.storages.BaseStorage | None = None

    @property
    def url(self) -> str:
        return "memory://"

    def __repr__(self) -> str:
        return "MemoryStore()"

    # -- studies ----------------------------------------------------------------------------------------
    def get_or_create_study(
        self, *, name: str, template: str, template_version: str, shape_key: str, shape_json: JsonInput,
        device_kind: str, device_name: str, fingerprint_hash: str, fingerprint_json: JsonInput,
    ) -> StudyRecord:
        key = {"template": template, "template_version": template_version, "shape_key": shape_key,
               "device_kind": device_kind, "device_name": device_name, "fingerprint_hash": fingerprint_hash}
        shape_text = canonical_json(shape_json, what="shape_json")
        fingerprint_text = canonical_json(fingerprint_json, what="fingerprint_json")
        with self._lock:
            for study in self._studies.values():
                stored = {f: getattr(study, f) for f in _KEY_FIELDS}
                if study.name == name:
                    if stored != key:
                        diff = ", ".join(f"{f}: stored {stored[f]!r}, given {key[f]!r}"
                                         for f in _KEY_FIELDS if stored[f] != key[f])
                        raise RecordConflictError(f"study {name!r} exists with another key ({diff})")
                    return study
                if stored == key:
                    raise RecordConflictError(f"study {name!r}: its key is already stored under the name "
                                              f"{study.name!r}")
            study = StudyRecord(id=next(self._ids), name=name, shape_json=shape_text,
                                fingerprint_json=fingerprint_text, created_at=_now(), **key)
            self._studies[study.id] = study
            return study

    def get_study(self, *, name: str | None = None, study_id: int | None = None) -> StudyRecord | None:
        if (name is None) == (study_id is None):
            raise ValueError("get_study: give exactly one of name= and study_id=")
        with self._lock:
            if study_id is not None:
                return self._studies.get(study_id)
            return next((s for s in self._studies.values() if s.name == name), None)

    def list_studies(self, *, template: str | None = None, device_kind: str | None = None) -> list[StudyRecord]:
        with self._lock:
            return [s for s in sorted(self._studies.values(), key=lambda s: s.id)
                    if template in (None, s.template) and device_kind in (None, s.device_kind)]

    # -- measurements -----------------------------------------------------------------------------------
    def record_measurement(self, measurement: NewMeasurement, *, slot_id: int | None = None) -> MeasurementRecord:
        m = measurement
        check_role(m.role)
        check_candidate(m.candidate)
        if slot_id is not None and m.trial_number is None:
            raise ValueError("a trial slot is spent on a trial's measurement: trial_number is missing")
        fields = {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}
        fields.update(
            config_json=canonical_json(m.config_json, what="config_json"), status=Status(m.status),
            errors_json=canonical_json(m.errors_json, what="errors_json"),
            kernels_json=canonical_json(m.kernels_json, what="kernels_json"),
            timer=None if m.timer is None else Timer(m.timer).value,
        )
        with self._lock:
            if m.study_id not in self._studies:
                raise NotFoundError(f"no study with id {m.study_id}")
            slot = None
            if slot_id is not None:
                slot = self._slots.get(slot_id)
                if slot is None:
                    raise SlotLostError(f"trial slot {slot_id} is no longer reserved (lease lost)")
                if slot.state != "reserved":
                    earlier = self._measurements.get(slot.measurement_id or -1)
                    if earlier is not None and (earlier.study_id, earlier.trial_number) == (m.study_id, m.trial_number):
                        return earlier  # this write was made before and its reply lost: nothing more
                    raise RecordConflictError(f"trial slot {slot_id} is already spent")
            record = MeasurementRecord(id=next(self._ids), created_at=_now(), **fields)
            self._measurements[record.id] = record
            if slot is not None:
                self._spend(slot, record)
            return record

    def _spend(self, slot: _Slot, record: MeasurementRecord) -> None:
        slot.state, slot.measurement_id = "done", record.id
        task = self._tasks[slot.task_id]
        if task.state in ("done", "failed"):  # kept; a finished task's counts are final (a cancelled one counts it)
            return
        changes: dict[str, Any] = {"trials_done": task.trials_done + 1,
                                   "trials_failed": task.trials_failed + (0 if record.ok else 1), "updated_at": _now()}
        if record.ok and record.median_us is not None and (task.best_us is None or record.median_us < task.best_us):
            changes.update(best_us=record.median_us, best_config_json=record.config_json)
        self._tasks[task.id] = dataclasses.replace(task, **changes)

    def get_measurement(self, *, measurement_id: int) -> MeasurementRecord | None:
        with self._lock:
            return self._measurements.get(measurement_id)

    def list_measurements(
        self, *, study_id: int, role: str | None = None, status: Status | str | None = None,
        candidate: str | None = None, round_id: str | None = None, config_json: str | None = None,
        limit: int | None = None, offset: int = 0, order: str = "id",
    ) -> list[MeasurementRecord]:
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}; got {order!r}")
        rows = self._filtered(study_id, role, status, candidate, round_id, config_json)
        if order == "-id":
            rows.reverse()
        elif order == "median_us":
            rows.sort(key=lambda r: (r.median_us is None, r.median_us or 0.0, r.id))
        return rows[offset:] if limit is None else rows[offset:offset + limit]

    def count_measurements(
        self, *, study_id: int, role: str | None = None, status: Status | str | None = None,
        candidate: str | None = None, round_id: str | None = None, config_json: str | None = None,
    ) -> int:
        return len(self._filtered(study_id, role, status, candidate, round_id, config_json))

    def _filtered(
        self, study_id: int, role: str | None, status: Status | str | None, candidate: str | None,
        round_id: str | None, config_json: str | None,
    ) -> list[MeasurementRecord]:
        if role is not None:
            check_role(role)
        wanted = None if status is None else Status(status)
        config = None if config_json is None else canonical_json(config_json, what="config_json")
        with self._lock:
            rows = sorted(self._measurements.values(), key=lambda r: r.id)
        return [r for r in rows if r.study_id == study_id and role in (None, r.role) and wanted in (None, r.status)
                and candidate in (None, r.candidate) and round_id in (None, r.round_id)
                and config in (None, r.config_json)]

    def latest_round(self, *, study_id: int) -> list[MeasurementRecord]:
        finals = [r for r in self._filtered(study_id, "final", None, None, None, None) if r.round_id is not None]
        if not finals:
            return []
        return self._filtered(study_id, "final", None, None, finals[-1].round_id, None)

    def round_defaults(self, *, measurement_ids: Sequence[int]) -> dict[int, float]:
        with self._lock:
            out: dict[int, float] = {}
            for i in measurement_ids:
                m = self._measurements.get(i)
                if m is None or m.role != "final" or m.round_id is None:
                    continue
                found = [d for d in self._measurements.values() if d.study_id == m.study_id and d.role == "final"
                         and d.round_id == m.round_id and d.candidate == DEFAULT_LABEL
                         and d.status is Status.OK and d.median_us is not None]
                if found:
                    out[i] = float(found[0].median_us)  # type: ignore[arg-type]
            return out

    # -- best configs -----------------------------------------------------------------------------------
    def publish_unless_disproved(self, *, study_id: int, measurement_id: int,
                                 published_at: datetime | None = None,
                                 replacing: int | None = None, holding: RoundHold | None = None) -> BestRecord | None:
        with self._lock:
            if holding is not None:
                task = self._tasks.get(holding.task_id)
                if task is None or task.state != "finalizing" or task.finalizer_id != holding.worker_id:
                    raise SlotLostError(f"worker {holding.worker_id} no longer holds the final round of task "
                                        f"{holding.task_id}: it was declared lost and the round given to another")
            if study_id not in self._studies:
                raise NotFoundError(f"no study with id {study_id}")
            if self._found_wrong(study_id, self._measurements.get(measurement_id)):
                return None
            current = self._best.get(study_id)
            if replacing is not None and (current is None or current.measurement_id != replacing):
                return None
            return self.publish_best(study_id=study_id, measurement_id=measurement_id, published_at=published_at)

    def _found_wrong(self, study_id: int, measurement: MeasurementRecord | None) -> bool:
        """Whether ``measurement`` is one of the study's and its config is among the study's
        :meth:`disproved_configs`; the caller holds the lock."""
        return (measurement is not None and measurement.study_id == study_id
                and measurement.config_json in self.disproved_configs(study_ids=[study_id]).get(study_id, ()))

    def publish_best(self, *, study_id: int, measurement_id: int, published_at: datetime | None = None) -> BestRecord:
        with self._lock:
            study = self._studies.get(study_id)
            if study is None:
                raise NotFoundError(f"no study with id {study_id}")
            m = self._measurements.get(measurement_id)
            if m is None:
                raise NotFoundError(f"no measurement with id {measurement_id}")
            what = f"measurement {m.id}"
            if m.study_id != study_id:
                raise RecordConflictError(f"{what} belongs to study {m.study_id}, not {study_id}")
            if m.status is not Status.OK:
                raise RecordConflictError(f"{what} is {m.status.value}, only OK measurements can be published")
            if m.median_us is None:
                raise RecordConflictError(f"{what} has no median time to publish")
            if m.candidate.startswith("comparator:"):
                raise RecordConflictError(f"{what} measured {m.candidate}, not a config of the template")
            previous = self._best.get(study_id)
            record = BestRecord(
                id=previous.id if previous else next(self._ids), study_id=study_id, measurement_id=m.id,
                config_json=m.config_json, median_us=m.median_us, p20_us=m.p20_us, p80_us=m.p80_us,
                n_samples=m.n_samples, timer=m.timer, shape_json=study.shape_json, published_at=published_at or _now(),
                **{f: getattr(study, f) for f in _KEY_FIELDS},
            )
            self._best[study_id] = record
            return record

    def get_best(
        self, *, template: str, shape_key: str, device_kind: str | None = None, device_name: str | None = None,
        fingerprint_hash: str | None = None, template_version: str | None = None,
    ) -> BestRecord | None:
        with self._lock:
            rows = [b for b in self._best.values() if b.template == template and b.shape_key == shape_key
                    and device_kind in (None, b.device_kind) and device_name in (None, b.device_name)
                    and fingerprint_hash in (None, b.fingerprint_hash)
                    and template_version in (None, b.template_version)]
        return max(rows, key=lambda b: (b.published_at, b.id), default=None)

    def withdraw_best(self, *, study_id: int) -> bool:
        with self._lock:
            return self._best.pop(study_id, None) is not None

    def get_study_best(self, *, study_id: int) -> BestRecord | None:
        with self._lock:
            return self._best.get(study_id)

    def list_best(
        self, *, template: str | None = None, device_kind: str | None = None, device_name: str | None = None
    ) -> list[BestRecord]:
        with self._lock:
            rows = [b for b in self._best.values() if template in (None, b.template)
                    and device_kind in (None, b.device_kind) and device_name in (None, b.device_name)]
        rows.sort(key=lambda b: (-b.published_at.timestamp(), -b.id))
        return sorted(rows, key=lambda b: (b.template, b.shape_key, b.device_kind, b.device_name))

    # -- the Optuna side ----------------------------------------------------------------------------------
    def optuna_storage(self, *, heartbeats: TrialHeartbeats | None = None) -> optuna.storages.BaseStorage:
        """The store's one ``InMemoryStorage`` (``heartbeats`` are ignored: in-memory trials cannot outlive
        their process, so there is nothing to retry)."""
        import optuna

        with self._lock:
            if self._optuna is None:
                self._optuna = optuna.storages.InMemoryStorage()
            return self._optuna

    def withdraw_waiting_trials(self, trial_ids: Sequence[int]) -> set[int]:
        """Fail those trials still WAITING. Atomic against this store's callers; one process only."""
        from optuna.trial import TrialState

        storage = self.optuna_storage()
        withdrawn: set[int] = set()
        with self._lock:
            for trial_id in trial_ids:
                if storage.get_trial(trial_id).state is TrialState.WAITING:
                    storage.set_trial_state_values(trial_id, TrialState.FAIL)
                    withdrawn.add(trial_id)
        return withdrawn

    # -- verifications --------------------------------------------------------------------------------------
    def add_verification(
        self, *, study_id: int, config_json: str, stored_us: float, median_us: float | None, low_us: float | None,
        high_us: float | None, drift: float | None, tolerance: float, flagged: bool, processes: int,
        figures: Sequence[Mapping[str, Any]], device_kind: str, device_name: str, fingerprint_hash: str,
        fingerprint_json: str, worker: str | None = None,
    ) -> VerificationRecord:
        with self._lock:
            record = self._new_verification(
                study_id=study_id, config_json=config_json, stored_us=stored_us, median_us=median_us,
                low_us=low_us, high_us=high_us, drift=drift, tolerance=tolerance, flagged=flagged,
                processes=processes, figures=figures, device_kind=device_kind, device_name=device_name,
                fingerprint_hash=fingerprint_hash, fingerprint_json=fingerprint_json, worker=worker,
            )
            self._verifications.append(record)
            return record

    def _new_verification(
        self, *, study_id: int, config_json: str, processes: int, figures: Sequence[Mapping[str, Any]],
        worker: str | None = None, **figures_and_device: Any,
    ) -> VerificationRecord:
        """The record :meth:`add_verification` stores (its arguments), checked and not yet stored; the caller
        holds the lock."""
        if study_id not in self._studies:
            raise NotFoundError(f"no study with id {study_id}")
        if processes < 1:
            raise ValueError(f"a verification runs at least one process, got {processes}")
        return VerificationRecord(
            id=next(self._ids), study_id=study_id, config_json=canonical_json(config_json, what="config_json"),
            processes=processes, figures_json=json.dumps(list(figures), sort_keys=True, separators=(",", ":")),
            worker=worker, created_at=_now(), **figures_and_device,
        )

    def record_disproval(
        self, *, best_measurement_id: int | None, stand_in_id: int | None = None, withdraw: bool = False,
        **verification: Any,
    ) -> Disproval | None:
        study_id = verification["study_id"]
        with self._lock:  # the checks and their order as the SQL store's
            if study_id not in self._studies:
                raise NotFoundError(f"no study with id {study_id}")
            check_disproval(best_measurement_id=best_measurement_id, stand_in_id=stand_in_id, withdraw=withdraw,
                            figures=verification["figures"], device_name=verification["device_name"],
                            study_device_name=self._studies[study_id].device_name)
            current = self._best.get(study_id)
            if (None if current is None else current.measurement_id) != best_measurement_id:
                return None  # a final round published meanwhile: the caller decides again
            stand_in = None if stand_in_id is None else self._measurements.get(stand_in_id)
            if stand_in is not None and stand_in.status is Status.OK and self._found_wrong(study_id, stand_in):
                return None  # a final round found the stand-in wrong meanwhile: the caller decides again
            record = self._new_verification(**verification)  # ValueError: nothing stored yet
            replacement = None
            if stand_in_id is not None:
                assert current is not None  # check_disproval: a stand-in names the best it replaces
                replacement = self.publish_best(study_id=record.study_id, measurement_id=stand_in_id,
                                                published_at=current.published_at)  # raises before any change
            withdrawn = withdraw and self.withdraw_best(study_id=record.study_id)
            self._verifications.append(record)
            return Disproval(record, replacement, withdrawn)

    def latest_verifications(self, *, study_ids: Sequence[int]) -> dict[int, VerificationRecord]:
        with self._lock:
            wanted = set(study_ids)
            return {v.study_id: v for v in self._verifications if v.study_id in wanted}  # later ones win

    def disproved_configs(self, *, study_ids: Sequence[int]) -> dict[int, frozenset[str]]:
        with self._lock:
            wanted = set(study_ids)
            found: dict[int, set[str]] = {}
            for m in self._measurements.values():
                if (m.study_id in wanted and m.role == "final" and m.status is Status.WRONG_RESULT
                        and not m.candidate.startswith(COMPARATOR_PREFIX)):
                    found.setdefault(m.study_id, set()).add(m.config_json)
            for v in self._verifications:
                if (v.study_id in wanted and v.device_name == self._studies[v.study_id].device_name
                        and v.wrong_processes):
                    found.setdefault(v.study_id, set()).add(v.config_json)
            return {study_id: frozenset(configs) for study_id, configs in found.items()}

    def list_verifications(
        self, *, study_id: int | None = None, template: str | None = None, limit: int = 100
    ) -> list[VerificationRecord]:
        with self._lock:
            found = [v for v in reversed(self._verifications)
                     if (study_id is None or v.study_id == study_id)
                     and (template is None or self._studies[v.study_id].template == template)]
            return found[:limit]

    # -- jobs -----------------------------------------------------------------------------------------------
    def create_verify_job(
        self, *, template: str, template_version: str, backend: str, device_kind: str, device_name: str | None,
        tasks: Sequence[tuple[str, str, str]], processes: int = 5, samples: int = 100,
        candidate_timeout_s: float = 120.0, comparators: bool = True, priority: int = 0,
        submitted_by: str | None = None, max_attempts: int = 3, comparator_processes: int | None = None,
        idempotency_key: str | None = None, request_hash: str | None = None,
    ) -> JobRecord:
        return self.create_job(
            template=template, template_version=template_version, backend=backend, device_kind=device_kind,
            device_name=device_name, trials=0, sampler="none", samples=samples,
            candidate_timeout_s=candidate_timeout_s, tasks=tasks, finalists=1, comparators=comparators,
            priority=priority, submitted_by=submitted_by, kind="verify", processes=processes,
            max_attempts=max_attempts, comparator_processes=comparator_processes,
            idempotency_key=idempotency_key, request_hash=request_hash,
        )

    def job_with_key(self, *, idempotency_key: str) -> JobRecord | None:
        with self._lock:
            found = next((j.id for j in self._jobs.values() if j.idempotency_key == idempotency_key), None)
            return None if found is None else self._job(found)

    def create_job(
        self, *, template: str, template_version: str, backend: str, device_kind: str, device_name: str | None,
        trials: int, sampler: str, samples: int, candidate_timeout_s: float, tasks: Sequence[tuple[str, str, str]],
        seed: int | None = None, finalists: int = 3, comparators: bool = True, priority: int = 0,
        submitted_by: str | None = None, kind: str = "tune", processes: int | None = None, max_attempts: int = 3,
        comparator_processes: int | None = None, idempotency_key: str | None = None, request_hash: str | None = None,
    ) -> JobRecord:
        check_tasks(tasks)
        check_job_kind(kind, trials, processes, comparator_processes)
        check_max_attempts(max_attempts)
        now = _now()
        with self._lock:
            if idempotency_key is not None and self.job_with_key(idempotency_key=idempotency_key) is not None:
                raise RecordConflictError(f"idempotency key {idempotency_key!r} is taken")
            job = JobRecord(
                id=next(self._ids), template=template, template_version=template_version, backend=backend,
                device_kind=device_kind, device_name=device_name, trials=trials, sampler=sampler, seed=seed,
                samples=samples, candidate_timeout_s=candidate_timeout_s, finalists=finalists,
                comparators=comparators, priority=priority, state="queued", error=None, submitted_by=submitted_by,
                created_at=now, updated_at=now, finished_at=None, kind=kind, processes=processes,
                max_attempts=max_attempts, comparator_processes=comparator_processes,
                idempotency_key=idempotency_key, request_hash=request_hash,
            )
            self._jobs[job.id] = job
            for position, (label, shape_key, shape_json) in enumerate(tasks):
                task = TaskRecord(
                    id=next(self._ids), job_id=job.id, position=position, label=label, shape_key=shape_key,
                    shape_json=shape_json, state="queued", trials_target=trials, trials_reserved=0, trials_done=0,
                    trials_failed=0, study_id=None, finalizer_id=None, best_us=None, best_config_json=None,
                    error=None, updated_at=now,
                )
                self._tasks[task.id] = task
            return self._job(job.id)

    def _job(self, job_id: int) -> JobRecord:
        tasks = tuple(sorted((t for t in self._tasks.values() if t.job_id == job_id), key=lambda t: t.position))
        ids = {t.id for t in tasks}
        workers = tuple(sorted(w.id for w in self._workers.values()
                               if w.current_task_id in ids and w.state == "busy"))
        return dataclasses.replace(self._jobs[job_id], tasks=tasks, workers=workers)

    def get_job(self, *, job_id: int) -> JobRecord | None:
        with self._lock:
            return self._job(job_id) if job_id in self._jobs else None

    def list_jobs(self, *, state: str | None = None, limit: int = 50, offset: int = 0) -> list[JobRecord]:
        with self._lock:
            ids = sorted((j.id for j in self._jobs.values() if state in (None, j.state)), reverse=True)
            return [self._job(i) for i in ids[offset:offset + limit]]

    def count_jobs(self, *, state: str | None = None) -> int:
        with self._lock:
            return sum(1 for j in self._jobs.values() if state in (None, j.state))

    def cancel_job(self, *, job_id: int) -> JobRecord:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise NotFoundError(f"no job {job_id}")
            if job.state in FINISHED_JOB_STATES:
                raise RecordConflictError(f"job {job_id} is already {job.state}")
            now = _now()
            self._jobs[job_id] = dataclasses.replace(job, state="cancelled", updated_at=now, finished_at=now)
            for task in [t for t in self._tasks.values() if t.job_id == job_id]:
                if task.state in ("queued", "running", "finalizing"):
                    self._tasks[task.id] = dataclasses.replace(task, state="cancelled", updated_at=now)
            return self._job(job_id)

    # -- workers ------------------------------------------------------------------------------------------
    def register_worker(
        self, *, worker_id: str, host: str, pid: int, device_kind: str, device_name: str, device_index: int,
        backends: Sequence[str], fingerprint_hash: str, fingerprint_json: str, lease_s: float,
        templates: Mapping[str, str] | None = None,
    ) -> WorkerRecord:
        now = _now()
        record = WorkerRecord(
            id=worker_id, host=host, pid=pid, device_kind=device_kind, device_name=device_name,
            device_index=device_index, backends_json=json.dumps(sorted(backends)), fingerprint_hash=fingerprint_hash,
            fingerprint_json=fingerprint_json, state="idle", current_task_id=None, started_at=now,
            last_heartbeat=now, lease_expires_at=now + timedelta(seconds=lease_s),
            templates_json=None if templates is None else canonical_json(dict(templates), what="templates"),
        )
        with self._lock:
            held = self._workers.get(worker_id)
            if held is not None and (held.host, held.pid, held.current_task_id) != (host, pid, None):
                raise RecordConflictError(f"worker {worker_id} is already registered")
            self._workers[worker_id] = record
        return record

    def clock(self) -> datetime:
        return _now()

    def heartbeat(self, *, worker_id: str, lease_s: float) -> bool:
        now = _now()
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None or worker.state not in ("idle", "busy"):
                return False
            self._workers[worker_id] = dataclasses.replace(
                worker, last_heartbeat=now, lease_expires_at=now + timedelta(seconds=lease_s))
            return True

    def rejoin_worker(self, *, worker_id: str, lease_s: float) -> bool:
        now = _now()
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                return False
            self._workers[worker_id] = dataclasses.replace(
                worker, state="idle", current_task_id=None, last_heartbeat=now,
                lease_expires_at=now + timedelta(seconds=lease_s))
            return True

    def list_workers(self, *, include_stopped: bool = False) -> list[WorkerRecord]:
        with self._lock:
            rows = [w for w in self._workers.values() if include_stopped or w.state in ("idle", "busy")]
        return sorted(rows, key=lambda w: w.started_at, reverse=True)

    def stop_worker(self, *, worker_id: str) -> None:
        with self._lock:
            self._release_worker(worker_id, "stopped")
            self._settle_given_up()

    def reap_lost_workers(self, *, now: datetime | None = None) -> list[str]:
        now = now or _now()
        with self._lock:
            lost = [w.id for w in self._workers.values()
                    if w.state in ("idle", "busy") and w.lease_expires_at < now]
            for worker_id in lost:
                self._release_worker(worker_id, "lost")
            late = {s.worker_id for s in self._slots.values() if s.state == "reserved"
                    and (w := self._workers.get(s.worker_id)) is not None and w.state in ("lost", "stopped")
                    and w.lease_expires_at < now}
            for worker_id in sorted(late):
                self._free_slots(worker_id, now)
            if lost or late:
                self._settle_given_up()
        return lost

    def _release_worker(self, worker_id: str, new_state: str) -> None:
        now = _now()
        self._free_slots(worker_id, now)
        self._return_final_round(worker_id, now)
        worker = self._workers.get(worker_id)
        if worker is not None:
            self._workers[worker_id] = dataclasses.replace(
                worker, state=new_state, current_task_id=None, lease_expires_at=now)

    def _return_final_round(self, worker_id: str, now: datetime) -> None:
        for task in [t for t in self._tasks.values() if t.finalizer_id == worker_id and t.state == "finalizing"]:
            self._tasks[task.id] = dataclasses.replace(task, state="running", finalizer_id=None, updated_at=now)

    def _free_slots(self, worker_id: str, now: datetime) -> None:
        for slot in [s for s in self._slots.values() if s.worker_id == worker_id and s.state == "reserved"]:
            task = self._tasks[slot.task_id]
            self._tasks[task.id] = dataclasses.replace(task, trials_reserved=task.trials_reserved - 1, updated_at=now)
            del self._slots[slot.id]

    # -- claiming and trial slots ---------------------------------------------------------------------------
    def claim_task(
        self, *, worker_id: str, device_kind: str, device_name: str, backends: Sequence[str]
    ) -> Claim | None:
        with self._lock:
            worker = self._workers.get(worker_id)
            claimant = ClaimingWorker(worker_id, device_kind, device_name, tuple(backends),
                                      None if worker is None else worker.templates)
            mine = [a for a in self._attempts if a.worker_id == worker_id]
            by_job: dict[int, list[TaskRecord]] = {}
            for t in sorted(self._tasks.values(), key=lambda t: t.position):
                by_job.setdefault(t.job_id, []).append(t)
            candidates = sorted(  # the rule: records.claimable_tasks (db.jobs.claim_task states it in SQL)
                (t for job_id, tasks in by_job.items()
                 for t in claimable_tasks(self._jobs[job_id], tasks, claimant, mine)),
                key=lambda t: (-self._jobs[t.job_id].priority, t.job_id, t.position))
            if not candidates:
                return None
            task, now = candidates[0], _now()
            job = self._jobs[task.job_id]
            if task.state == "queued":
                task = self._tasks[task.id] = dataclasses.replace(task, state="running", updated_at=now)
            if job.state == "queued":
                self._jobs[job.id] = dataclasses.replace(job, state="running", updated_at=now)
            if worker is not None:
                self._workers[worker_id] = dataclasses.replace(worker, state="busy", current_task_id=task.id)
            return Claim(self._job(job.id), task)

    def attach_study(self, *, task_id: int, study_id: int) -> None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is not None and task.study_id is None:
                self._tasks[task_id] = dataclasses.replace(task, study_id=study_id)

    def reserve_slot(self, *, task_id: int, worker_id: str) -> int | None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or task.state != "running" or task.trials_reserved >= task.trials_target:
                return None
            self._tasks[task_id] = dataclasses.replace(
                task, trials_reserved=task.trials_reserved + 1, updated_at=_now())
            slot = _Slot(next(self._ids), task_id, worker_id, "reserved")
            self._slots[slot.id] = slot
            return slot.id

    def release_slot(self, *, slot_id: int) -> None:
        with self._lock:
            slot = self._slots.get(slot_id)
            if slot is None or slot.state != "reserved":
                return
            task = self._tasks[slot.task_id]
            self._tasks[task.id] = dataclasses.replace(task, trials_reserved=task.trials_reserved - 1,
                                                       updated_at=_now())
            del self._slots[slot_id]

    def get_task(self, *, task_id: int) -> TaskRecord | None:
        with self._lock:
            return self._tasks.get(task_id)

    def job_state(self, *, job_id: int) -> str | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return None if job is None else job.state

    # -- finishing ------------------------------------------------------------------------------------------
    def end_search(self, *, task_id: int) -> bool:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or task.state != "running" or task.trials_reserved >= task.trials_target:
                return False
            self._tasks[task_id] = dataclasses.replace(task, trials_target=task.trials_reserved, updated_at=_now())
            return True

    def begin_finalize(self, *, task_id: int, worker_id: str) -> bool:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or task.state != "running" or task.trials_done < task.trials_target:
                return False
            self._tasks[task_id] = dataclasses.replace(task, state="finalizing", finalizer_id=worker_id,
                                                       updated_at=_now())
            return True

    def finish_task(
        self, *, task_id: int, worker_id: str, best_us: float | None, best_config_json: str | None,
        error: str | None = None, verification_id: int | None = None,
    ) -> JobRecord:
        error = storable_text(error)
        with self._lock:
            task = self._tasks.get(task_id)
            if task is not None and task.state in ("done", "failed") and task.finalizer_id == worker_id:
                return self._job(task.job_id)  # a repeat of this worker's finish
            if task is None or task.state != "finalizing" or task.finalizer_id != worker_id:
                raise RecordConflictError(f"task {task_id} is not being finalised by {worker_id}")
            now = _now()
            changes: dict[str, Any] = {"state": "failed" if error else "done", "error": error, "updated_at": now}
            if best_us is not None:
                changes.update(best_us=best_us, best_config_json=best_config_json)
            if verification_id is not None:
                check = self._verification(verification_id)
                changes.update(verification_id=check.id, study_id=task.study_id or check.study_id)
            self._tasks[task_id] = dataclasses.replace(task, **changes)
            job = self._jobs[task.job_id]
            tasks = [t for t in self._tasks.values() if t.job_id == job.id]
            if job.state == "running" and all(t.state in ("done", "failed") for t in tasks):
                failed = [t for t in sorted(tasks, key=lambda t: t.id) if t.state == "failed"]
                self._jobs[job.id] = dataclasses.replace(
                    job, state="failed" if failed else "done", updated_at=now, finished_at=now,
                    error="; ".join(f"{t.label}: {t.error}" for t in failed) if failed else None,
                )
            return self._job(job.id)

    def fail_task(self, *, task_id: int, error: str) -> None:
        error = storable_text(error) or ""
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or task.state in ("done", "failed", "cancelled"):
                return
            now = _now()
            self._tasks[task_id] = dataclasses.replace(task, state="failed", error=error, updated_at=now,
                                                       finalizer_id=None)  # its finaliser's finish: refused
            job = self._jobs[task.job_id]
            tasks = [t for t in self._tasks.values() if t.job_id == job.id]
            if job.state in ACTIVE_JOB_STATES and all(t.state in ("done", "failed") for t in tasks):
                self._jobs[job.id] = dataclasses.replace(job, state="failed", error=error, updated_at=now,
                                                         finished_at=now)

    def release_task(self, *, worker_id: str) -> None:
        with self._lock:
            now = _now()
            self._free_slots(worker_id, now)
            self._return_final_round(worker_id, now)
            worker = self._workers.get(worker_id)
            if worker is not None and worker.state == "busy":
                self._workers[worker_id] = dataclasses.replace(worker, state="idle", current_task_id=None)

    def withdraw_template(self, *, worker_id: str, template: str, version: str) -> None:
        with self._lock:  # reentrant: it leaves its task as release_task does, as the SQL store does
            self.release_task(worker_id=worker_id)
            worker = self._workers.get(worker_id)
            if worker is None:
                return
            has = worker.templates
            if has is None or has.get(template) == version:
                rest = {k: v for k, v in (has or {}).items() if k != template}
                worker = dataclasses.replace(worker, templates_json=canonical_json(rest, what="templates"))
            self._workers[worker_id] = worker
            self._settle_given_up()

    def fail_attempt(self, *, task_id: int, worker_id: str, reason: str) -> TaskRecord:
        reason = storable_text(reason) or ""
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                raise NotFoundError(f"no task {task_id}")
            now = _now()
            self.release_task(worker_id=worker_id)  # reentrant; a final round it held goes back too
            if task.state in ("done", "failed", "cancelled"):
                return self._tasks[task_id]
            task = self._tasks[task_id]  # its reserved count and state changed with the slots and the round
            if not any(a.task_id == task_id and a.worker_id == worker_id for a in self._attempts):
                self._attempts.append(TaskAttemptRecord(task_id, worker_id, reason, now))
            attempts = [a for a in self._attempts if a.task_id == task_id]
            self._tasks[task_id] = dataclasses.replace(task, attempts=len(attempts), updated_at=now)
            self._settle_given_up()
            return self._tasks[task_id]

    def _settle_given_up(self) -> None:
        """Fail the active tasks their job's ``max_attempts`` workers gave up that no live worker is on or may
        still claim (as the SQL store does)."""
        now = _now()
        for task in sorted(self._tasks.values(), key=lambda t: t.id):
            job = self._jobs[task.job_id]
            if (task.state not in OPEN_TASK_STATES or job.state not in ACTIVE_JOB_STATES
                    or task.attempts < job.max_attempts):
                continue
            attempts = [a for a in self._attempts if a.task_id == task.id]
            holders = {s.worker_id for s in self._slots.values() if s.task_id == task.id and s.state == "reserved"}
            if task_may_still_run(task, job, list(self._workers.values()), attempts, holders, now):
                continue
            self._tasks[task.id] = dataclasses.replace(task, state="failed", error=attempts_error(attempts),
                                                       updated_at=now)
            self._close_failed_job(task.job_id, now)

    def _close_failed_job(self, job_id: int, now: datetime) -> None:
        """Fail the job of a failed task once none of its tasks runs, listing each failed task's error."""
        job = self._jobs[job_id]
        tasks = sorted((t for t in self._tasks.values() if t.job_id == job_id), key=lambda t: t.position)
        if job.state in ACTIVE_JOB_STATES and all(t.state in ("done", "failed") for t in tasks):
            error = "; ".join(f"{t.label}: {t.error}" for t in tasks if t.state == "failed")
            self._jobs[job_id] = dataclasses.replace(job, state="failed", error=error, updated_at=now,
                                                     finished_at=now)

    def list_attempts(self, *, task_id: int) -> list[TaskAttemptRecord]:
        with self._lock:
            return [a for a in self._attempts if a.task_id == task_id]

    def attempts_by_task(self, *, task_ids: Sequence[int]) -> dict[int, list[TaskAttemptRecord]]:
        with self._lock:
            wanted = set(task_ids)
            found: dict[int, list[TaskAttemptRecord]] = {}
            for a in self._attempts:
                if a.task_id in wanted:
                    found.setdefault(a.task_id, []).append(a)
            return found

    def verifications_by_task(self, *, task_ids: Sequence[int]) -> dict[int, VerificationRecord]:
        with self._lock:
            return {t.id: self._verification(t.verification_id) for t in map(self._tasks.get, task_ids)
                    if t is not None and t.verification_id is not None}

    def _verification(self, verification_id: int) -> VerificationRecord:
        """The stored verification of this id (NotFoundError when none); the caller holds the lock."""
        found = next((v for v in self._verifications if v.id == verification_id), None)
        if found is None:
            raise NotFoundError(f"no verification with id {verification_id}")
        return found
