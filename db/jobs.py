"""Repository functions of the job queue: jobs, tasks (one per shape), trial slots, workers and leases.

Protocol (tuner.service.worker drives it):
  * ``claim_task`` — a worker takes a task of a job whose device requirement and backend it satisfies, in
    one transaction (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; SQLite: the store's writes take the database
    lock up front, so claims are serialised on one host). Several workers may hold the same task.
  * ``reserve_slot`` before each trial (an atomic conditional increment: never more than the target);
    ``complete_slot`` in the same transaction as the trial's measurement; ``release_slot`` when a trial
    did not need a measurement (invalid or duplicate config) or the worker stops.
  * ``begin_finalize`` — when every slot of a task is done, exactly one worker wins the right to run
    the final round; ``finish_task`` closes the task and, with its last task, the job.
  * ``heartbeat`` renews a worker's lease; ``reap_lost_workers`` releases what workers whose lease
    expired held (their reserved slots, a task they were finalising), so others finish the job.
  * mixed fleets: a worker advertises its templates at registration and claims only tasks of those; one
    that cannot load a template stops advertising it (``withdraw_template``, nothing charged to the task);
    ``fail_attempt`` records a worker that could not run a task (a reason of the task's, on that worker)
    and leaves it to the others. A task fails by attempts only once its job's ``max_attempts`` workers gave
    it up and no live worker is on it or may still claim it (``task_may_still_run``).
Lock order: a write that locks a task's row and its job's locks the tasks first (in id order when several),
then the job (``claim_task``, ``finish_task``, ``fail_task``, ``cancel_job``, a task given up). A cancel
that locked the job first and then its tasks deadlocked with a claim or a finish (PostgreSQL then failed
one side).
Timestamps come from the store's clock (:func:`tuner.db.models.store_now`: PostgreSQL's
``statement_timestamp()``, SQLite's host), UTC: hosts whose clocks differ neither reap each other early nor keep
a dead worker's lease late.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, exists, false, func, or_, select, true, update
from sqlalchemy.orm import Session

from tuner.db._chunks import in_chunks
from tuner.db._convert import as_utc, canonical_json, to_record
from tuner.db.models import (
    JobRow,
    MeasurementRow,
    SlotRow,
    TaskAttemptRow,
    TaskRow,
    VerificationRow,
    WorkerRow,
    store_now,
)
from tuner.errors import NotFoundError, RecordConflictError, SlotLostError
from tuner.store.records import (
    ACTIVE_JOB_STATES,
    OPEN_TASK_STATES,
    Claim,
    JobRecord,
    TaskAttemptRecord,
    TaskRecord,
    VerificationRecord,
    WorkerRecord,
    attempts_error,
    check_job_kind,
    check_max_attempts,
    check_tasks,
    storable_text,
    task_may_still_run,
)

FINISHED_JOB_STATES = ("done", "failed", "cancelled")


# -- jobs -----------------------------------------------------------------------------------------------
def create_job(
    session: Session,
    *,
    template: str,
    template_version: str,
    backend: str,
    device_kind: str,
    device_name: str | None,
    trials: int,
    sampler: str,
    samples: int,
    candidate_timeout_s: float,
    tasks: Sequence[tuple[str, str, str]],
    seed: int | None = None,
    finalists: int = 3,
    comparators: bool = True,
    priority: int = 0,
    submitted_by: str | None = None,
    kind: str = "tune",
    processes: int | None = None,
    max_attempts: int = 3,
    comparator_processes: int | None = None,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
) -> JobRecord:
    """A queued job with one task per ``(label, shape_key, shape_json)``; ValueError when there is none or
    a shape repeats (callers validate shapes against the template before), or when ``kind`` is unknown,
    a tuning job has no trials or has ``comparator_processes``, a verify job has trials, no processes or
    ``comparator_processes`` outside 1..``processes`` (see :func:`create_verify_job`), or ``max_attempts``
    (see :func:`fail_attempt`) is below 1. RecordConflictError, nothing created, when the
    ``idempotency_key`` is taken (racing creations: the later insert meets the key; the caller answers a repeat
    with :func:`job_with_key`'s job, :func:`tuner.store.records.repeated`)."""
    check_tasks(tasks)
    check_job_kind(kind, trials, processes, comparator_processes)
    check_max_attempts(max_attempts)
    if idempotency_key is not None and job_with_key(session, idempotency_key=idempotency_key) is not None:
        raise RecordConflictError(f"idempotency key {idempotency_key!r} is taken")
    now = store_now(session)
    job = JobRow(
        template=template, template_version=template_version, backend=backend, device_kind=device_kind,
        device_name=device_name, trials=trials, sampler=sampler, seed=seed, samples=samples,
        candidate_timeout_s=candidate_timeout_s, finalists=finalists, comparators=comparators, priority=priority,
        state="queued", submitted_by=submitted_by, created_at=now, updated_at=now, kind=kind, processes=processes,
        max_attempts=max_attempts, comparator_processes=comparator_processes, idempotency_key=idempotency_key,
        request_hash=request_hash,
    )
    session.add(job)
    session.flush()
    for position, (label, shape_key, shape_json) in enumerate(tasks):
        session.add(TaskRow(
            job_id=job.id, position=position, label=label, shape_key=shape_key, shape_json=shape_json,
            state="queued", trials_target=trials, trials_reserved=0, trials_done=0, trials_failed=0,
            updated_at=now,
        ))
    session.flush()
    return _job_record(session, job)


def job_with_key(session: Session, *, idempotency_key: str) -> JobRecord | None:
    """The job created under this idempotency key, or None."""
    job = session.scalars(select(JobRow).where(JobRow.idempotency_key == idempotency_key)).first()
    return None if job is None else _job_record(session, job)


def create_verify_job(
    session: Session,
    *,
    template: str,
    template_version: str,
    backend: str,
    device_kind: str,
    device_name: str | None,
    tasks: Sequence[tuple[str, str, str]],
    processes: int = 5,
    samples: int = 100,
    candidate_timeout_s: float = 120.0,
    comparators: bool = True,
    priority: int = 0,
    submitted_by: str | None = None,
    max_attempts: int = 3,
    comparator_processes: int | None = None,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
) -> JobRecord:
    """A queued verify job: for each ``(label, shape_key, shape_json)``, a worker of the device re-measures the
    published best of that shape (and the comparators) in ``processes`` fresh processes and records a
    verification (:func:`tuner.driver.reverify.verify_best`). ``comparator_processes`` (None: every process)
    limits the comparators to the first that many processes. Its tasks have no trials: one worker takes each.
    ValueError and the idempotency key as :func:`create_job`."""
    return create_job(
        session, template=template, template_version=template_version, backend=backend, device_kind=device_kind,
        device_name=device_name, trials=0, sampler="none", samples=samples, candidate_timeout_s=candidate_timeout_s,
        tasks=tasks, finalists=1, comparators=comparators, priority=priority, submitted_by=submitted_by,
        kind="verify", processes=processes, max_attempts=max_attempts, comparator_processes=comparator_processes,
        idempotency_key=idempotency_key, request_hash=request_hash,
    )


def get_job(session: Session, *, job_id: int) -> JobRecord | None:
    job = session.get(JobRow, job_id)
    return None if job is None else _job_record(session, job)


def list_jobs(
    session: Session, *, state: str | None = None, limit: int = 50, offset: int = 0
) -> list[JobRecord]:
    """Jobs, newest first, with their tasks."""
    query = select(JobRow).order_by(JobRow.id.desc()).offset(offset).limit(limit)
    if state is not None:
        query = query.where(JobRow.state == state)
    return _job_records(session, list(session.scalars(query)))


def count_jobs(session: Session, *, state: str | None = None) -> int:
    query = select(func.count(JobRow.id))
    if state is not None:
        query = query.where(JobRow.state == state)
    return int(session.scalar(query) or 0)


def cancel_job(session: Session, *, job_id: int) -> JobRecord:
    """Cancel a queued or running job and its unfinished tasks; workers stop at their next trial.

    Raises NotFoundError for an unknown id and RecordConflictError when the job has already finished.

    Locks the job's tasks (in id order), then the job (the module's lock order).
    """
    if session.get(JobRow, job_id) is None:
        raise NotFoundError(f"no job {job_id}")
    session.scalars(select(TaskRow.id).where(TaskRow.job_id == job_id).order_by(TaskRow.id).with_for_update()).all()
    job = session.get(JobRow, job_id, with_for_update=True, populate_existing=True)
    assert job is not None  # jobs are never deleted
    if job.state in FINISHED_JOB_STATES:
        raise RecordConflictError(f"job {job_id} is already {job.state}")
    now = store_now(session)
    job.state, job.updated_at, job.finished_at = "cancelled", now, now
    session.execute(
        update(TaskRow)
        .where(TaskRow.job_id == job_id, TaskRow.state.in_(("queued", "running", "finalizing")))
        .values(state="cancelled", updated_at=now)
    )
    session.flush()
    return _job_record(session, job)


def _job_record(session: Session, job: JobRow) -> JobRecord:
    return _job_records(session, [job])[0]


def _job_records(session: Session, jobs: Sequence[JobRow]) -> list[JobRecord]:
    """The records of ``jobs`` with their tasks and the busy workers on them: two queries for all the jobs
    (a page of jobs is one read, not two per job), each sent once per :data:`~tuner.db._chunks.IN_CHUNK` ids."""
    if not jobs:
        return []
    tasks: dict[int, list[TaskRecord]] = {job.id: [] for job in jobs}
    for chunk in in_chunks(tasks):
        for t in session.scalars(select(TaskRow).where(TaskRow.job_id.in_(chunk))
                                 .order_by(TaskRow.job_id, TaskRow.position)):
            tasks[t.job_id].append(to_record(TaskRecord, t))
    job_of = {t.id: job_id for job_id, ts in tasks.items() for t in ts}
    workers: dict[int, list[str]] = {job.id: [] for job in jobs}
    for chunk in in_chunks(job_of):
        for worker_id, task_id in session.execute(
            select(WorkerRow.id, WorkerRow.current_task_id)
            .where(WorkerRow.current_task_id.in_(chunk), WorkerRow.state == "busy").order_by(WorkerRow.id)
        ):
            if task_id is not None:  # the query's filter: for the type checker
                workers[job_of[task_id]].append(worker_id)
    out = []
    for job in jobs:
        fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(JobRecord)
                  if f.name not in ("tasks", "workers")}
        for name in ("created_at", "updated_at", "finished_at"):
            if fields[name] is not None:
                fields[name] = as_utc(fields[name])
        out.append(JobRecord(**fields, tasks=tuple(tasks[job.id]), workers=tuple(workers[job.id])))
    return out


# -- workers ------------------------------------------------------------------------------------------
def register_worker(
    session: Session,
    *,
    worker_id: str,
    host: str,
    pid: int,
    device_kind: str,
    device_name: str,
    device_index: int,
    backends: Sequence[str],
    fingerprint_hash: str,
    fingerprint_json: str,
    lease_s: float,
    templates: Mapping[str, str] | None = None,
) -> WorkerRecord:
    """A new idle worker; ``templates`` (name → version) are the only templates it will claim (None: any).
    The same id again from the same host and pid, holding no task, is registered afresh (a retry whose first
    commit went through); RecordConflictError otherwise (and on a concurrent insert of the id: its key)."""
    now = store_now(session)
    fields: dict[str, Any] = {
        "host": host, "pid": pid, "device_kind": device_kind, "device_name": device_name,
        "device_index": device_index, "backends_json": json.dumps(sorted(backends)),
        "fingerprint_hash": fingerprint_hash, "fingerprint_json": fingerprint_json, "state": "idle",
        "current_task_id": None, "started_at": now, "last_heartbeat": now,
        "lease_expires_at": now + timedelta(seconds=lease_s),
        "templates_json": None if templates is None else canonical_json(dict(templates), what="templates"),
    }
    row = session.get(WorkerRow, worker_id, with_for_update=True)
    if row is None:
        row = WorkerRow(id=worker_id, **fields)
        session.add(row)
    elif (row.host, row.pid, row.current_task_id) == (host, pid, None):
        for name, value in fields.items():
            setattr(row, name, value)
    else:
        raise RecordConflictError(f"worker {worker_id} is already registered (by {row.host}, pid {row.pid})")
    session.flush()
    return to_record(WorkerRecord, row)


def heartbeat(session: Session, *, worker_id: str, lease_s: float) -> bool:
    """Renew the worker's lease. False when it was declared lost (its work was given to others): the
    worker must then stop what it does without recording more results."""
    now = store_now(session)
    result = session.execute(
        update(WorkerRow)
        .where(WorkerRow.id == worker_id, WorkerRow.state.in_(("idle", "busy")))
        .values(last_heartbeat=now, lease_expires_at=now + timedelta(seconds=lease_s))
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def list_workers(session: Session, *, include_stopped: bool = False) -> list[WorkerRecord]:
    query = select(WorkerRow).order_by(WorkerRow.started_at.desc())
    if not include_stopped:
        query = query.where(WorkerRow.state.in_(("idle", "busy")))
    return [to_record(WorkerRecord, w) for w in session.scalars(query)]


def stop_worker(session: Session, *, worker_id: str) -> None:
    """A worker leaving cleanly: its reserved slots go back to their tasks, its lease ends."""
    _release_worker(session, worker_id, new_state="stopped")
    _settle_given_up(session)


def reap_lost_workers(session: Session, *, now: datetime | None = None) -> list[str]:
    """Declare workers whose lease expired lost and give back what they held; returns their ids."""
    now = now or store_now(session)
    lost = list(session.scalars(
        select(WorkerRow.id).where(WorkerRow.state.in_(("idle", "busy")), WorkerRow.lease_expires_at < now)
        .with_for_update(skip_locked=True)
    ))
    for worker_id in lost:
        _release_worker(session, worker_id, new_state="lost")
    # A worker already declared lost (or stopped) may still have reserved slots since, alive but cut off
    # until it rejoins; killed before it does, it would hold them for good: they go back too.
    # Their rows locked (another reaper's skipped): a worker rejoining meanwhile waits, and its new slots
    # are not taken for late ones.
    late = list(session.scalars(
        select(WorkerRow.id).where(
            WorkerRow.state.in_(("lost", "stopped")), WorkerRow.lease_expires_at < now,
            exists().where(SlotRow.worker_id == WorkerRow.id, SlotRow.state == "reserved"))
        .with_for_update(skip_locked=True)
    ))
    for worker_id in late:
        _free_slots(session, worker_id, now)
    if lost or late:
        _settle_given_up(session)
    return lost


def rejoin_worker(session: Session, *, worker_id: str, lease_s: float) -> bool:
    """A worker declared lost while it was alive (cut off from the store longer than its lease) comes back:
    idle again with a new lease. What it held was given back when it was reaped. False when there is no
    such worker (its row is gone: it must register again)."""
    now = store_now(session)
    result = session.execute(
        update(WorkerRow).where(WorkerRow.id == worker_id)
        .values(state="idle", current_task_id=None, last_heartbeat=now,
                lease_expires_at=now + timedelta(seconds=lease_s))
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def _release_worker(session: Session, worker_id: str, *, new_state: str) -> None:
    now = store_now(session)
    _free_slots(session, worker_id, now)
    _return_final_round(session, worker_id, now)
    session.execute(
        update(WorkerRow).where(WorkerRow.id == worker_id)
        .values(state=new_state, current_task_id=None, lease_expires_at=now)
    )


def _return_final_round(session: Session, worker_id: str, now: datetime) -> None:
    """A final round the worker began and did not finish goes back to 'running', where any worker may claim
    and finish it (it left the task: a store error in the round, or it stopped or was declared lost)."""
    session.execute(
        update(TaskRow).where(TaskRow.finalizer_id == worker_id, TaskRow.state == "finalizing")
        .values(state="running", finalizer_id=None, updated_at=now)
    )


def _free_slots(session: Session, worker_id: str, now: datetime) -> None:
    """Give the worker's reserved (not yet measured) slots back to their tasks.

    Each task gives back exactly the slots this statement deleted: counted from the deleted rows, not from an
    earlier read, so that a slot the worker itself released or spent meanwhile (it may still be alive when
    reaped; PostgreSQL's READ COMMITTED lets that commit in between) is not given back twice."""
    freed = Counter(session.scalars(
        delete(SlotRow).where(SlotRow.worker_id == worker_id, SlotRow.state == "reserved")
        .returning(SlotRow.task_id)
    ).all())
    for task_id, n in sorted(freed.items()):
        session.execute(
            update(TaskRow).where(TaskRow.id == task_id)
            .values(trials_reserved=TaskRow.trials_reserved - n, updated_at=now)
        )


# -- claiming and trial slots ----------------------------------------------------------------------------
def claim_task(
    session: Session,
    *,
    worker_id: str,
    device_kind: str,
    device_name: str,
    backends: Sequence[str],
) -> Claim | None:
    """The next task this worker can serve (highest priority, oldest job, first shape), or None.

    The rule is :func:`tuner.store.records.claimable_tasks` (which the in-memory store and the job page use),
    stated here as one query: keep the two in step (the store contract suite checks they agree). The job is
    active and the task open (queued or running) with a free slot (``has_free_slot``): trial slots left, or
    all its trials done and nobody finalising it (its finaliser was lost); a verify job's tasks have no
    trials: they are claimable until a worker takes their final step (``begin_finalize``). The job's device
    and backend are the worker's, its template one the worker advertised (when it did), and the task is not
    one this worker gave up (``fail_attempt``). The worker becomes busy on it; the task and job run.

    Locks the task's row (``SKIP LOCKED``), then, for a queued job, the job's row (its state changes): the
    module's lock order.
    """
    claimable = or_(  # records.has_free_slot
        TaskRow.trials_reserved < TaskRow.trials_target,
        and_(TaskRow.state == "running", TaskRow.trials_done >= TaskRow.trials_target),
        TaskRow.trials_target == 0,
    )
    advertised = session.scalar(select(WorkerRow.templates_json).where(WorkerRow.id == worker_id))
    has_template: ColumnElement[bool] = true()
    if advertised is not None:
        has = json.loads(advertised)
        has_template = or_(false(), *(
            and_(JobRow.template == name, JobRow.template_version == version) for name, version in has.items()
        ))
    given_up = exists().where(TaskAttemptRow.task_id == TaskRow.id, TaskAttemptRow.worker_id == worker_id)
    query = (
        select(TaskRow)
        .join(JobRow, JobRow.id == TaskRow.job_id)
        .where(
            JobRow.state.in_(ACTIVE_JOB_STATES),
            TaskRow.state.in_(OPEN_TASK_STATES),
            claimable,
            JobRow.device_kind == device_kind,
            or_(JobRow.device_name.is_(None), JobRow.device_name == device_name),
            JobRow.backend.in_(list(backends)),
            has_template,
            ~given_up,
        )
        .order_by(JobRow.priority.desc(), JobRow.id, TaskRow.position)
        .limit(1)
        .with_for_update(skip_locked=True, of=TaskRow)
    )
    task = session.scalars(query).first()
    if task is None:
        return None
    now = store_now(session)
    job = session.get(JobRow, task.job_id)
    assert job is not None
    if task.state == "queued":
        task.state, task.updated_at = "running", now
    if job.state == "queued":
        job.state, job.updated_at = "running", now
    session.execute(
        update(WorkerRow).where(WorkerRow.id == worker_id).values(state="busy", current_task_id=task.id)
    )
    session.flush()
    return Claim(_job_record(session, job), to_record(TaskRecord, task))


def attach_study(session: Session, *, task_id: int, study_id: int) -> None:
    session.execute(update(TaskRow).where(TaskRow.id == task_id, TaskRow.study_id.is_(None)).values(study_id=study_id))


def reserve_slot(session: Session, *, task_id: int, worker_id: str) -> int | None:
    """Reserve one trial of the task for this worker; the slot id, or None when every trial is taken or
    the task no longer runs (cancelled, finished)."""
    now = store_now(session)
    result = session.execute(
        update(TaskRow)
        .where(TaskRow.id == task_id, TaskRow.state == "running", TaskRow.trials_reserved < TaskRow.trials_target)
        .values(trials_reserved=TaskRow.trials_reserved + 1, updated_at=now)
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        return None
    slot = SlotRow(task_id=task_id, worker_id=worker_id, state="reserved", created_at=now)
    session.add(slot)
    session.flush()
    return slot.id


def spent_on(session: Session, *, slot_id: int, study_id: int, trial_number: int) -> int | None:
    """The measurement id a spent slot holds when it was spent on trial ``trial_number`` of study ``study_id``
    (a write that committed and whose reply was lost, tried again); None otherwise (locks the slot's row)."""
    slot = session.get(SlotRow, slot_id, with_for_update=True)
    if slot is None or slot.state != "done" or slot.trial_number != trial_number or slot.measurement_id is None:
        return None
    row = session.get(MeasurementRow, slot.measurement_id)
    return slot.measurement_id if row is not None and row.study_id == study_id else None


def complete_slot(
    session: Session,
    *,
    slot_id: int,
    trial_number: int,
    measurement_id: int,
    ok: bool,
    median_us: float | None,
    config_json: str,
) -> None:
    """Mark a reserved slot done with its measurement (call in the transaction that stores it).

    Raises SlotLostError when the slot is gone (its worker was declared lost and the slot given back), and
    RecordConflictError when it is already spent: the caller's transaction then rolls back, so the
    measurement is not stored twice."""
    slot = session.get(SlotRow, slot_id, with_for_update=True)
    if slot is None:
        raise SlotLostError(f"trial slot {slot_id} is no longer reserved (lease lost)")
    if slot.state != "reserved":
        raise RecordConflictError(f"trial slot {slot_id} is already spent")
    slot.state, slot.trial_number, slot.measurement_id = "done", trial_number, measurement_id
    task = session.get(TaskRow, slot.task_id, with_for_update=True)
    assert task is not None
    if task.state in ("done", "failed"):  # the measurement is kept; a finished task's counts are final
        session.flush()
        return
    # a task cancelled while the trial ran still counts it: the trial is measured and stored (a cancel stops
    # the next trials, not the one running), and the job's progress must agree with its study's trials
    task.trials_done += 1
    task.trials_failed += 0 if ok else 1
    if ok and median_us is not None and (task.best_us is None or median_us < task.best_us):
        task.best_us, task.best_config_json = median_us, config_json
    task.updated_at = store_now(session)
    session.flush()


def release_slot(session: Session, *, slot_id: int) -> None:
    """Give back a reserved slot that did not lead to a measurement (no-op when it is already gone)."""
    slot = session.get(SlotRow, slot_id, with_for_update=True)
    if slot is None or slot.state != "reserved":
        return
    session.execute(
        update(TaskRow).where(TaskRow.id == slot.task_id)
        .values(trials_reserved=TaskRow.trials_reserved - 1, updated_at=store_now(session))
    )
    session.delete(slot)
    session.flush()


def get_task(session: Session, *, task_id: int) -> TaskRecord | None:
    task = session.get(TaskRow, task_id)
    return None if task is None else to_record(TaskRecord, task)


def job_state(session: Session, *, job_id: int) -> str | None:
    return session.scalar(select(JobRow.state).where(JobRow.id == job_id))


# -- finishing -------------------------------------------------------------------------------------------
def begin_finalize(session: Session, *, task_id: int, worker_id: str) -> bool:
    """Take the final round of a task whose trials are all done; True for exactly one caller."""
    result = session.execute(
        update(TaskRow)
        .where(TaskRow.id == task_id, TaskRow.state == "running", TaskRow.trials_done >= TaskRow.trials_target)
        .values(state="finalizing", finalizer_id=worker_id, updated_at=store_now(session))
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def end_search(session: Session, *, task_id: int) -> bool:
    """Bring a running task's trial target down to its reserved slots: its search has no new config to
    measure; the trials in flight may still be told (and a slot given back unmeasured lets the next call
    bring the target lower). True when it came down."""
    result = session.execute(
        update(TaskRow)
        .where(TaskRow.id == task_id, TaskRow.state == "running", TaskRow.trials_reserved < TaskRow.trials_target)
        .values(trials_target=TaskRow.trials_reserved, updated_at=store_now(session))
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def finish_task(
    session: Session,
    *,
    task_id: int,
    worker_id: str,
    best_us: float | None,
    best_config_json: str | None,
    error: str | None = None,
    verification_id: int | None = None,
) -> JobRecord:
    """Close a task this worker finalised (done, or failed with ``error``), and its job with its last task;
    a verify task keeps the verification it recorded (``verification_id``), and its study when it has none.

    A repeat by the same worker of a finish that went through (a retry whose answer was lost) changes
    nothing and returns the job. Raises RecordConflictError when the worker no longer holds the final round
    (declared lost), NotFoundError for an unknown verification. ``error`` is kept as
    :func:`tuner.store.records.storable_text` writes it."""
    error = storable_text(error)
    task = session.get(TaskRow, task_id, with_for_update=True)
    if task is not None and task.state in ("done", "failed") and task.finalizer_id == worker_id:
        job = session.get(JobRow, task.job_id)  # a repeat of this worker's finish (its answer was lost)
        assert job is not None
        return _job_record(session, job)
    if task is None or task.state != "finalizing" or task.finalizer_id != worker_id:
        raise RecordConflictError(f"task {task_id} is not being finalised by {worker_id}")
    if verification_id is not None:
        check = session.get(VerificationRow, verification_id)
        if check is None:
            raise NotFoundError(f"no verification with id {verification_id}")
        task.verification_id, task.study_id = check.id, task.study_id or check.study_id
    now = store_now(session)
    task.state = "failed" if error else "done"
    task.error, task.updated_at = error, now
    if best_us is not None:
        task.best_us, task.best_config_json = best_us, best_config_json
    session.flush()
    job = session.get(JobRow, task.job_id, with_for_update=True)
    assert job is not None
    states = list(session.scalars(select(TaskRow.state).where(TaskRow.job_id == job.id)))
    if job.state == "running" and all(s in ("done", "failed") for s in states):
        job.state = "failed" if "failed" in states else "done"
        job.error = None if job.state == "done" else "; ".join(
            f"{t.label}: {t.error}" for t in session.scalars(
                select(TaskRow).where(TaskRow.job_id == job.id, TaskRow.state == "failed")
            )
        )
        job.updated_at = job.finished_at = now
    session.flush()
    return _job_record(session, job)


def fail_task(session: Session, *, task_id: int, error: str) -> None:
    """Fail a task that cannot run anywhere (e.g. its template no longer loads); the job fails with it
    once no other task runs. A worker finalising the task holds it no more (its finish is refused).
    ``error`` is kept as :func:`tuner.store.records.storable_text` writes it (a compiler's message with a
    NUL byte must not fail the worker's failure path in turn)."""
    error = storable_text(error) or ""
    now = store_now(session)
    task = session.get(TaskRow, task_id, with_for_update=True)
    if task is None or task.state in ("done", "failed", "cancelled"):
        return
    # no finaliser any more: a finish from the worker that was finalising it is then refused, not taken
    # for a repeat of its own finish (it would return as if its result had been stored)
    task.state, task.error, task.updated_at, task.finalizer_id = "failed", error, now, None
    session.flush()
    job = session.get(JobRow, task.job_id, with_for_update=True)
    assert job is not None
    states = list(session.scalars(select(TaskRow.state).where(TaskRow.job_id == job.id)))
    if job.state in ACTIVE_JOB_STATES and all(s in ("done", "failed") for s in states):
        job.state, job.error, job.updated_at, job.finished_at = "failed", error, now, now
    session.flush()


def release_task(session: Session, *, worker_id: str) -> None:
    """The worker leaves its current task (it stays claimable by others) and becomes idle; trial slots it
    still holds reserved go back to their tasks (nothing it does not measure now stays reserved), and a
    final round it began and did not finish (a store error in the round) goes back to 'running' for any
    worker to finish."""
    now = store_now(session)
    _free_slots(session, worker_id, now)
    _return_final_round(session, worker_id, now)
    session.execute(
        update(WorkerRow).where(WorkerRow.id == worker_id, WorkerRow.state == "busy")
        .values(state="idle", current_task_id=None)
    )


def withdraw_template(session: Session, *, worker_id: str, template: str, version: str) -> None:
    """The worker cannot load ``template`` at ``version``: it stops advertising it (it never claims its tasks
    again) and leaves its current task as :func:`release_task` does; nothing is charged to the task. A
    worker that advertised nothing (any template) advertises, from now on, nothing at all."""
    release_task(session, worker_id=worker_id)
    worker = session.get(WorkerRow, worker_id, with_for_update=True)
    if worker is None:
        return
    has = {} if worker.templates_json is None else dict(json.loads(worker.templates_json))
    if has.get(template) == version or worker.templates_json is None:
        has.pop(template, None)
        worker.templates_json = canonical_json(has, what="templates")
    session.flush()
    _settle_given_up(session)


def fail_attempt(session: Session, *, task_id: int, worker_id: str, reason: str) -> TaskRecord:
    """The worker could not run the task, for a reason of the task's on that worker (its device failed on
    it): record the attempt (once per worker), leave the task as :func:`release_task` does (a final round
    it held goes back too). The task fails with every worker's reason once its job's ``max_attempts``
    distinct workers gave it up and no live worker is on it or may still claim it (its job fails with it
    once no other task runs). A task already finished is left as it is. NotFoundError for an unknown task.
    ``reason`` is kept as :func:`tuner.store.records.storable_text` writes it."""
    reason = storable_text(reason) or ""
    task = session.get(TaskRow, task_id, with_for_update=True)
    if task is None:
        raise NotFoundError(f"no task {task_id}")
    release_task(session, worker_id=worker_id)
    now = store_now(session)
    session.refresh(task)  # its reserved count and state changed with the slots and a final round it held
    if task.state in ("done", "failed", "cancelled"):
        return to_record(TaskRecord, task)
    known = session.scalar(select(TaskAttemptRow.id).where(
        TaskAttemptRow.task_id == task_id, TaskAttemptRow.worker_id == worker_id))
    if known is None:
        session.add(TaskAttemptRow(task_id=task_id, worker_id=worker_id, reason=reason, created_at=now))
        session.flush()
    task.attempts = int(session.scalar(
        select(func.count(TaskAttemptRow.id)).where(TaskAttemptRow.task_id == task_id)) or 0)
    task.updated_at = now
    session.flush()
    _settle_given_up(session, task_ids=[task_id])
    session.refresh(task)
    return to_record(TaskRecord, task)


def _settle_given_up(session: Session, *, task_ids: Sequence[int] | None = None) -> None:
    """Fail the active tasks that their job's ``max_attempts`` workers gave up and that no live worker is on
    or may still claim (``task_may_still_run``); each job fails with its last such task. Locks those tasks (in
    id order), then their jobs (the module's lock order)."""
    query = (
        select(TaskRow).join(JobRow, JobRow.id == TaskRow.job_id)
        .where(TaskRow.state.in_(OPEN_TASK_STATES), JobRow.state.in_(ACTIVE_JOB_STATES),
               TaskRow.attempts >= JobRow.max_attempts)
        .order_by(TaskRow.id)
        .with_for_update(of=TaskRow)
    )
    if task_ids is not None:
        query = query.where(TaskRow.id.in_(list(task_ids)))
    exhausted = list(session.scalars(query))
    if not exhausted:
        return
    now = store_now(session)
    workers = [to_record(WorkerRecord, w) for w in session.scalars(
        select(WorkerRow).where(WorkerRow.state.in_(("idle", "busy"))))]
    for task in exhausted:
        job = session.get(JobRow, task.job_id, with_for_update=True)
        assert job is not None
        attempts = list_attempts(session, task_id=task.id)
        holders = set(session.scalars(
            select(SlotRow.worker_id).where(SlotRow.task_id == task.id, SlotRow.state == "reserved")))
        if task_may_still_run(to_record(TaskRecord, task), _job_record(session, job), workers, attempts, holders,
                              now):
            continue
        task.state, task.error, task.updated_at = "failed", attempts_error(attempts), now
        session.flush()
        tasks = list(session.scalars(select(TaskRow).where(TaskRow.job_id == job.id).order_by(TaskRow.position)))
        if all(t.state in ("done", "failed") for t in tasks):
            job.state, job.updated_at, job.finished_at = "failed", now, now
            job.error = "; ".join(f"{t.label}: {t.error}" for t in tasks if t.state == "failed")
        session.flush()


def list_attempts(session: Session, *, task_id: int) -> list[TaskAttemptRecord]:
    """The workers that gave the task up, oldest first."""
    rows = session.scalars(
        select(TaskAttemptRow).where(TaskAttemptRow.task_id == task_id).order_by(TaskAttemptRow.id)
    )
    return [to_record(TaskAttemptRecord, r) for r in rows]


def attempts_by_task(session: Session, *, task_ids: Sequence[int]) -> dict[int, list[TaskAttemptRecord]]:
    """The attempts of each of these tasks that has any, oldest first, by task id: one query per
    :data:`~tuner.db._chunks.IN_CHUNK` ids (a page of 500 jobs may list more tasks than PostgreSQL binds)."""
    found: dict[int, list[TaskAttemptRecord]] = {}
    for chunk in in_chunks(sorted(task_ids)):
        for row in session.scalars(
            select(TaskAttemptRow).where(TaskAttemptRow.task_id.in_(chunk)).order_by(TaskAttemptRow.id)
        ):
            found.setdefault(row.task_id, []).append(to_record(TaskAttemptRecord, row))
    return found


def verifications_by_task(session: Session, *, task_ids: Sequence[int]) -> dict[int, VerificationRecord]:
    """The verification each of these tasks recorded (:func:`finish_task`), by task id: one query per
    :data:`~tuner.db._chunks.IN_CHUNK` ids."""
    found: dict[int, VerificationRecord] = {}
    for chunk in in_chunks(task_ids):
        for task_id, row in session.execute(
            select(TaskRow.id, VerificationRow).join(VerificationRow, VerificationRow.id == TaskRow.verification_id)
            .where(TaskRow.id.in_(chunk))
        ):
            found[task_id] = to_record(VerificationRecord, row)
    return found
