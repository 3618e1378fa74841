"""The store contract of the engine: what the driver, the worker and the reports need from a store.

The engine defines these protocols; ``tuner.db.Store`` implements them on SQLite and PostgreSQL and
:class:`tuner.store.memory.MemoryStore` in memory (unit tests). One shared test-suite
(``tests/store/test_store_contract.py``) runs against all three.

Conventions shared by every method:

* Each call is one transaction: it is applied entirely or not at all.
* Arguments and results are plain values and the frozen records of :mod:`tuner.store.records`; records
  are immutable snapshots, valid after the call (they hold no connection).
* Lookups (``get_*``, ``list_*``, ``latest_round``) return None or an empty list when nothing matches.
* Writes that name a row by id raise :class:`tuner.errors.NotFoundError` when it does not exist (unless
  their own docstring says otherwise: a worker's task writes), and :class:`tuner.errors.RecordConflictError`
  when the stored state forbids them (nothing is written then); invalid arguments raise ValueError.
* Infrastructure failures (database unreachable, locked, lost connection) raise
  :class:`tuner.errors.StoreError`, translated once inside the implementation.
* Implementations are thread-safe (share one instance across threads) and safe across processes where
  the backend is shared (several workers on one database); the memory store serves one process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tuner.store.records import (
    BestRecord,
    Claim,
    Disproval,
    JobRecord,
    MeasurementRecord,
    NewMeasurement,
    RoundHold,
    Status,
    StudyRecord,
    TaskAttemptRecord,
    TaskRecord,
    VerificationRecord,
    WorkerRecord,
)
from tuner.store.records import JsonInput as JsonInput

if TYPE_CHECKING:
    import optuna

ORDERS = ("id", "-id", "median_us")  # median_us: fastest first, rows without a time last


@dataclass(frozen=True)
class TrialHeartbeats:
    """Optuna trial heartbeats for studies shared by workers: a trial whose process stops beating for
    ``grace_s`` is failed by the next worker and retried (at most ``max_retry`` times) with the same
    parameters. Immutable."""

    interval_s: int
    grace_s: int
    max_retry: int = 3


@runtime_checkable
class TuningStore(Protocol):
    """Studies, measurements and published best configs, beside the Optuna studies of the same key."""

    @property
    def url(self) -> str:
        """Where the store lives, safe to log (passwords masked)."""

    # -- studies ----------------------------------------------------------------------------------------
    def get_or_create_study(
        self, *, name: str, template: str, template_version: str, shape_key: str, shape_json: JsonInput,
        device_kind: str, device_name: str, fingerprint_hash: str, fingerprint_json: JsonInput,
    ) -> StudyRecord:
        """The study named ``name``, created with these fields if absent; race-safe across processes (two
        creators get the one study). An existing study keeps its stored JSON. RecordConflictError when
        ``name`` is stored under another key or the key under another name."""

    def get_study(self, *, name: str | None = None, study_id: int | None = None) -> StudyRecord | None:
        """The study with this name or id (exactly one of them; ValueError otherwise)."""

    def list_studies(self, *, template: str | None = None, device_kind: str | None = None) -> list[StudyRecord]:
        """Studies matching the filters (None: any), oldest first."""

    # -- measurements -----------------------------------------------------------------------------------
    def record_measurement(self, measurement: NewMeasurement, *, slot_id: int | None = None) -> MeasurementRecord:
        """Store one measurement and, with ``slot_id``, spend that trial slot on it, in one transaction: the
        measurement is stored if and only if its slot is spent. NotFoundError for an unknown study;
        SlotLostError (a RecordConflictError) when the slot no longer exists (its worker was declared lost
        and the slot given back), RecordConflictError when it is already spent on another trial (another study
        or trial number): then nothing is stored. A slot already spent on this study's trial ``trial_number``
        returns the measurement stored then, as it is (the fields are not compared), and stores nothing: the
        same write made again after its reply was lost (a connection dropped at commit);
        ValueError for an invalid role, candidate, status, timer or JSON. A slot of a task that has finished
        meanwhile (failed, cancelled) is spent, its measurement kept, and the task's counts stay as they are."""

    def get_measurement(self, *, measurement_id: int) -> MeasurementRecord | None: ...

    def list_measurements(
        self, *, study_id: int, role: str | None = None, status: Status | str | None = None,
        candidate: str | None = None, round_id: str | None = None, config_json: str | None = None,
        limit: int | None = None, offset: int = 0, order: str = "id",
    ) -> list[MeasurementRecord]:
        """Measurements of a study matching the filters, in ``order`` (one of ORDERS; ``median_us``: fastest
        first, rows without a time last, ties by id). ValueError for an unknown order, role or status."""

    def count_measurements(
        self, *, study_id: int, role: str | None = None, status: Status | str | None = None,
        candidate: str | None = None, round_id: str | None = None, config_json: str | None = None,
    ) -> int:
        """How many measurements :meth:`list_measurements` would list without limit."""

    def latest_round(self, *, study_id: int) -> list[MeasurementRecord]:
        """The rows of the study's most recent final round (the round holding the newest final row), by id."""

    def round_defaults(self, *, measurement_ids: Sequence[int]) -> dict[int, float]:
        """For each of these final-round measurements, the median of the OK ``default`` candidate of the same
        round (the measurement itself when it is the default); ids without one are left out. One read."""

    # -- best configs -----------------------------------------------------------------------------------
    def publish_best(self, *, study_id: int, measurement_id: int, published_at: datetime | None = None) -> BestRecord:
        """Publish a measurement as its study's best config (replacing the previous one), stamped now (by the
        store's clock) or at ``published_at`` (a stand-in for a disproved best keeps its time: the lookup
        prefers the newest).
        NotFoundError for an unknown study or measurement; RecordConflictError when the measurement is of
        another study, not OK, has no median, or measured a comparator."""

    def publish_unless_disproved(self, *, study_id: int, measurement_id: int,
                                 published_at: datetime | None = None,
                                 replacing: int | None = None, holding: RoundHold | None = None) -> BestRecord | None:
        """:meth:`publish_best` (stamped now, or at ``published_at``), unless the measurement's config was found wrong
        (:meth:`disproved_configs`), or, with ``replacing`` (a measurement id), unless the study's best is that
        measurement's when the publish runs (another publish came first: ``tuner rejudge`` does not overwrite
        it): then nothing changes and None is returned, before the measurement's own checks. The check and the publish
        are one transaction, serialised with :meth:`record_disproval` (the study's row is locked): a final
        round that read the disproved configs before a verification disproved its winner does not publish
        it after. With ``holding``, only while that worker holds that task's final round (the task finalizing,
        that worker its finaliser), checked in the same transaction: else SlotLostError and nothing changes (the
        worker was declared lost and the round handed to another, whose publish must not be overwritten by the
        older round's). Raises as :meth:`publish_best` (a measurement of a disproved config returns None
        before its other checks). Thread-safe."""

    def get_best(
        self, *, template: str, shape_key: str, device_kind: str | None = None, device_name: str | None = None,
        fingerprint_hash: str | None = None, template_version: str | None = None,
    ) -> BestRecord | None:
        """The most recently published best config matching the key (None in a filter: any)."""

    def get_study_best(self, *, study_id: int) -> BestRecord | None: ...

    def withdraw_best(self, *, study_id: int) -> bool:
        """Unpublish the study's best config (a verification found it wrong and no config of its round can
        stand in); the lookup then serves the shape as it would an untuned one. Returns whether one was
        published. Its measurements, rounds and verifications are kept."""

    def list_best(
        self, *, template: str | None = None, device_kind: str | None = None, device_name: str | None = None
    ) -> list[BestRecord]:
        """Best configs matching the filters, by template, shape, device, newest first."""

    # -- verifications (``tuner verify``) ------------------------------------------------------------------
    def add_verification(
        self, *, study_id: int, config_json: str, stored_us: float, median_us: float | None, low_us: float | None,
        high_us: float | None, drift: float | None, tolerance: float, flagged: bool, processes: int,
        figures: Sequence[Mapping[str, Any]], device_kind: str, device_name: str, fingerprint_hash: str,
        fingerprint_json: str, worker: str | None = None,
    ) -> VerificationRecord:
        """Record one re-measurement of a study's best (kept, never replaced). NotFoundError for an unknown
        study; ValueError for fewer than one process."""

    def record_disproval(
        self, *, best_measurement_id: int | None, stand_in_id: int | None = None, withdraw: bool = False,
        study_id: int, config_json: str, stored_us: float, median_us: float | None, low_us: float | None,
        high_us: float | None, drift: float | None, tolerance: float, flagged: bool, processes: int,
        figures: Sequence[Mapping[str, Any]], device_kind: str, device_name: str, fingerprint_hash: str,
        fingerprint_json: str, worker: str | None = None,
    ) -> Disproval | None:
        """Record a verification that found the re-measured config wrong (the fields as
        :meth:`add_verification`) and, in the same transaction, act on the study's best as the caller decided
        on the best it read, whose measurement id is ``best_measurement_id`` (None: none was published):
        publish measurement ``stand_in_id`` in its place, keeping the replaced best's ``published_at`` (a
        stand-in is not newer for the lookup), or withdraw it (``withdraw``), or leave it (neither: the best
        read was not disproved). The study's best is locked while it is compared and changed: when it is no
        longer that measurement (a final round published meanwhile), nothing is stored, the verification
        neither, and None is returned: read the best again and decide again; so too when the stand-in's
        config was found wrong since (a final round's WRONG_RESULT stored meanwhile). Otherwise returns what was
        stored (:class:`tuner.store.records.Disproval`). Nothing is stored either when it raises:
        NotFoundError for an unknown study or stand-in measurement; RecordConflictError when the stand-in is
        not publishable (as :meth:`publish_best`), or a stand-in or a withdrawal is asked of a verification on
        another device name than the study's (it disproves nothing); ValueError as :meth:`add_verification`,
        for a stand-in and a withdrawal both, either without ``best_measurement_id`` or either for figures
        without a wrong process (:func:`tuner.store.records.check_disproval`). Thread-safe and, on a shared
        database, safe against other processes' writes of the same best."""

    def latest_verifications(self, *, study_ids: Sequence[int]) -> dict[int, VerificationRecord]:
        """The most recent verification of each of these studies that has one."""

    def disproved_configs(self, *, study_ids: Sequence[int]) -> dict[int, frozenset[str]]:
        """For each of these studies that has any, the ``config_json`` of the configs found wrong
        (:func:`tuner.store.entries.disproved_in`): those of its final-round measurements with status
        WRONG_RESULT (comparators left out: they are not configs of the template), and those of its
        verifications with ``wrong_processes`` above zero on the study's own device name. Studies without any,
        and unknown ids, are left out. One read, however many studies."""

    def list_verifications(
        self, *, study_id: int | None = None, template: str | None = None, limit: int = 100
    ) -> list[VerificationRecord]:
        """Verifications, newest first, of one study or of a template's studies (None: any)."""

    # -- the Optuna side of the same studies ------------------------------------------------------------
    def optuna_storage(self, *, heartbeats: TrialHeartbeats | None = None) -> optuna.storages.BaseStorage:
        """An Optuna storage holding the Optuna studies beside this store's (the same database, so that
        optuna-dashboard shows them; one shared in-memory storage for the memory store)."""

    def withdraw_waiting_trials(self, trial_ids: Sequence[int]) -> set[int]:
        """Fail those of the Optuna trials ``trial_ids`` (of :meth:`optuna_storage`) that are still WAITING,
        atomically per trial (a trial another worker popped meanwhile keeps running); returns the ids
        failed."""


@runtime_checkable
class JobQueue(Protocol):
    """Tuning jobs, one task per shape, trial slots shared by workers, workers and their leases.

    Protocol: ``claim_task`` (one transaction; on PostgreSQL ``FOR UPDATE SKIP LOCKED``); ``reserve_slot``
    before each trial, :meth:`TuningStore.record_measurement` with the slot to spend it, ``release_slot``
    when a trial needed no measurement; ``begin_finalize`` gives the final round to exactly one worker;
    ``finish_task`` closes the task (and its job with its last task); ``heartbeat`` renews a lease and
    ``reap_lost_workers`` gives back what expired workers held. Timestamps are UTC from the store's clock
    (:meth:`clock`), so that hosts whose clocks differ agree on every lease.
    """

    def create_job(
        self, *, template: str, template_version: str, backend: str, device_kind: str, device_name: str | None,
        trials: int, sampler: str, samples: int, candidate_timeout_s: float, tasks: Sequence[tuple[str, str, str]],
        seed: int | None = None, finalists: int = 3, comparators: bool = True, priority: int = 0,
        submitted_by: str | None = None, kind: str = "tune", processes: int | None = None, max_attempts: int = 3,
        comparator_processes: int | None = None, idempotency_key: str | None = None,
        request_hash: str | None = None,
    ) -> JobRecord:
        """A queued job with one task per ``(label, shape_key, shape_json)``; ``max_attempts``: the distinct
        workers that must give a task up before it may fail (:meth:`fail_attempt`; the server's setting,
        ``TUNER_TASK_ATTEMPTS``). ValueError when there is no task or a shape repeats, or the kind is unknown,
        a tuning job has no trials or has ``comparator_processes``, a verify job has trials, no processes or
        ``comparator_processes`` outside 1..``processes``, or ``max_attempts`` < 1.

        ``idempotency_key`` (a submitter's, e.g. ``POST /v1/jobs``'s ``Idempotency-Key``) and the hash of
        the request are kept with the job; a key is unique: a creation under a key already taken (racing or
        not) creates nothing and raises RecordConflictError. The caller tells a repeat (a client retrying
        after a lost answer) from another request with :meth:`job_with_key` and
        :func:`tuner.store.records.repeated`."""

    def create_verify_job(
        self, *, template: str, template_version: str, backend: str, device_kind: str, device_name: str | None,
        tasks: Sequence[tuple[str, str, str]], processes: int = 5, samples: int = 100,
        candidate_timeout_s: float = 120.0, comparators: bool = True, priority: int = 0,
        submitted_by: str | None = None, max_attempts: int = 3, comparator_processes: int | None = None,
        idempotency_key: str | None = None, request_hash: str | None = None,
    ) -> JobRecord:
        """A queued verify job: per shape, a worker of the device re-measures its published best (and the
        comparators) in ``processes`` fresh processes and records a verification (no trials; one worker takes
        each task). ``comparator_processes`` (None: every process) limits the comparators to the first that
        many processes (:func:`tuner.driver.reverify.verify_best`), kept with the job. ValueError and the
        idempotency key as :meth:`create_job`."""

    def job_with_key(self, *, idempotency_key: str) -> JobRecord | None:
        """The job created under this idempotency key (:meth:`create_job`), or None."""

    def get_job(self, *, job_id: int) -> JobRecord | None: ...

    def list_jobs(self, *, state: str | None = None, limit: int = 50, offset: int = 0) -> list[JobRecord]:
        """Jobs, newest first, with their tasks."""

    def count_jobs(self, *, state: str | None = None) -> int: ...

    def cancel_job(self, *, job_id: int) -> JobRecord:
        """Cancel a queued or running job and its unfinished tasks. NotFoundError for an unknown id,
        RecordConflictError when it has already finished."""

    def register_worker(
        self, *, worker_id: str, host: str, pid: int, device_kind: str, device_name: str, device_index: int,
        backends: Sequence[str], fingerprint_hash: str, fingerprint_json: str, lease_s: float,
        templates: Mapping[str, str] | None = None,
    ) -> WorkerRecord:
        """A new idle worker with a lease. ``templates`` advertises the templates it has, name → version:
        it will claim only tasks of those (mixed fleets); None advertises nothing and claims any template.
        Idempotent for its caller: the same id registered again from the same host and pid, holding no task
        (a retry whose first commit went through but whose answer was lost), is registered afresh with these
        fields. RecordConflictError when the id is another host's or process's, or holds a task."""

    def clock(self) -> datetime:
        """The store's current time (UTC, aware): what leases are set and judged by (on PostgreSQL the
        server's clock, not the caller's). Compare a lease with it, not with the caller's clock."""

    def heartbeat(self, *, worker_id: str, lease_s: float) -> bool:
        """Renew the worker's lease; False when it was declared lost (it must stop recording results)."""

    def rejoin_worker(self, *, worker_id: str, lease_s: float) -> bool:
        """A worker declared lost while alive (cut off from the store longer than its lease) comes back:
        idle with a new lease; what it held was given back when it was reaped. False when the store has no
        such worker (its row is gone): it must register again."""

    def list_workers(self, *, include_stopped: bool = False) -> list[WorkerRecord]: ...

    def stop_worker(self, *, worker_id: str) -> None:
        """A worker leaving cleanly: its reserved slots go back to their tasks, its lease ends."""

    def reap_lost_workers(self, *, now: datetime | None = None) -> list[str]:
        """Declare workers whose lease expired lost and give back what they held; returns their ids. Slots a
        worker reserved after it was declared lost (alive, cut off, not yet rejoined) go back too."""

    def claim_task(
        self, *, worker_id: str, device_kind: str, device_name: str, backends: Sequence[str]
    ) -> Claim | None:
        """The next task this worker can serve (highest priority, oldest job, first shape), or None: of its
        device and a backend it runs, of a template and version it advertises (when it advertised any; see
        :meth:`withdraw_template`), and not one it already gave up (:meth:`fail_attempt`)."""

    def attach_study(self, *, task_id: int, study_id: int) -> None:
        """Record the study a task's trials go to (the first one attached stays). An unknown task id changes
        nothing (no error)."""

    def reserve_slot(self, *, task_id: int, worker_id: str) -> int | None:
        """Reserve one trial of the task; the slot id, or None when every trial is taken or the task no
        longer runs."""

    def release_slot(self, *, slot_id: int) -> None:
        """Give back a reserved slot that led to no measurement (no-op when it is already gone)."""

    def get_task(self, *, task_id: int) -> TaskRecord | None: ...

    def job_state(self, *, job_id: int) -> str | None: ...

    def begin_finalize(self, *, task_id: int, worker_id: str) -> bool:
        """Take the final round of a task whose trials are all done; True for exactly one caller."""

    def end_search(self, *, task_id: int) -> bool:
        """A worker's search has no new config to measure (its grid or exhaustive sampler handed out every
        point, or its sampler proposed only known or invalid configs for a run of asks): the task's trial
        target comes down to its reserved slots — no slot is granted after, the trials in flight elsewhere
        are still told, and once they are the final round can be taken (a slot given back unmeasured lets a
        later call bring the target lower still). Only while it runs; True when the target came down."""

    def finish_task(
        self, *, task_id: int, worker_id: str, best_us: float | None, best_config_json: str | None,
        error: str | None = None, verification_id: int | None = None,
    ) -> JobRecord:
        """Close a task this worker finalised; RecordConflictError when it no longer holds the round. A
        repeat by the same worker of a finish that went through (its answer lost) returns the job, unchanged.
        ``verification_id``: the verification a verify task recorded, kept with the task (its study becomes
        the task's when it has none; :meth:`verifications_by_task` reads it back); NotFoundError for an
        unknown one, and nothing changes then."""

    def fail_task(self, *, task_id: int, error: str) -> None:
        """Fail a task that cannot run anywhere; its job fails once no other task runs. A worker finalising
        the task holds it no more: its :meth:`finish_task` raises RecordConflictError. An unknown task id
        changes nothing (no error): the worker's failure path must not fail in turn."""

    def release_task(self, *, worker_id: str) -> None:
        """The worker leaves its current task (it stays claimable by others) and becomes idle; the trial
        slots it still holds reserved go back to their tasks, and a final round it began and did not finish
        goes back to 'running' (any worker may finish it)."""

    def withdraw_template(self, *, worker_id: str, template: str, version: str) -> None:
        """The worker cannot load ``template`` at ``version`` (not importable, another version): it stops
        advertising it, so it never claims its tasks again, and leaves its current task as
        :meth:`release_task` does. Nothing is charged to the task (no attempt): a template a worker lacks
        says nothing about the task. A worker that advertised nothing (any template) advertises nothing at
        all from then on."""

    def fail_attempt(self, *, task_id: int, worker_id: str, reason: str) -> TaskRecord:
        """The worker could not run the task for a reason of the task's on this worker (its device failed
        while running it): the attempt is recorded with the worker and the reason, and the worker leaves the
        task as :meth:`release_task` does (its reserved slots and a final round it held go back), never to
        claim it again. Attempts count distinct workers (a worker's second attempt counts once). The task
        fails, with every worker's reason (:func:`tuner.store.records.attempts_error`), only once its job's
        ``max_attempts`` workers (set at submission, the same for the whole fleet) have given it up and no
        live worker is on it (holds a slot, works on it, finalises it) or may still claim it (serves the job
        and has not given it up): :func:`tuner.store.records.task_may_still_run`. That is checked again
        whenever a worker stops, is reaped or withdraws a template. Its job fails with it once no other task
        runs. A task already finished is left as it is. Returns the task as left; NotFoundError for an
        unknown task."""

    def list_attempts(self, *, task_id: int) -> list[TaskAttemptRecord]:
        """The workers that gave the task up (:meth:`fail_attempt`), oldest first."""

    def attempts_by_task(self, *, task_ids: Sequence[int]) -> dict[int, list[TaskAttemptRecord]]:
        """:meth:`list_attempts` of each of these tasks that has any attempt, by task id (tasks without any,
        and unknown ids, are left out). One read, however many tasks."""

    def verifications_by_task(self, *, task_ids: Sequence[int]) -> dict[int, VerificationRecord]:
        """The verification each of these tasks recorded (a verify task's, :meth:`finish_task`), by task id
        (tasks without one, and unknown ids, are left out). One read, however many tasks."""
