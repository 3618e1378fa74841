"""A job as the API serves it (:class:`tuner.api.schemas.JobOut`): each task's attempts with their reasons,
and why the job waits. Shared by the ``/v1/jobs`` routes and the job page, so that both say the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone

from tuner.api.schemas import JobOut
from tuner.store import JobQueue, JobRecord, TaskAttemptRecord, WorkerRecord
from tuner.store.records import ACTIVE_JOB_STATES, waiting_reason


def task_attempts(store: JobQueue, job: JobRecord) -> dict[int, list[TaskAttemptRecord]]:
    """The attempts of each of the job's tasks that has any, by task id (one read per such task).
    Raises what the store raises (:class:`tuner.errors.StoreError`)."""
    return {t.id: store.list_attempts(task_id=t.id) for t in job.tasks if t.attempts}


def job_out(store: JobQueue, job: JobRecord, workers: Sequence[WorkerRecord] | None = None,
            attempts: Mapping[int, Sequence[TaskAttemptRecord]] | None = None) -> JobOut:
    """The job as served: each task's attempts with their reasons, and why the job waits (when it does).

    ``workers``: the live workers (``store.list_workers()``), read when needed and not given; ``attempts``:
    :func:`task_attempts` of the job, read when not given. Raises what the store raises."""
    if attempts is None:
        attempts = task_attempts(store, job)
    waiting = None
    if job.state in ACTIVE_JOB_STATES and not job.workers:
        live = store.list_workers() if workers is None else workers
        waiting = waiting_reason(job, live, attempts, datetime.now(timezone.utc))
    return JobOut.of(job, attempts, waiting)
