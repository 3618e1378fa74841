"""A job as the API serves it (:class:`tuner.api.schemas.JobOut`): each task's attempts with their reasons,
and why the job waits. Shared by the ``/v1/jobs`` routes and the job page, so that both say the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone

from tuner.api.schemas import JobOut
from tuner.store import JobQueue, JobRecord, TaskAttemptRecord, WorkerRecord
from tuner.store.records import ACTIVE_JOB_STATES, waiting_reason


def task_attempts(store: JobQueue, jobs: Sequence[JobRecord]) -> dict[int, list[TaskAttemptRecord]]:
    """The attempts of each task of these jobs that has any, by task id: one read for all the jobs (none when
    no task has an attempt). Raises what the store raises (:class:`tuner.errors.StoreError`)."""
    task_ids = [t.id for job in jobs for t in job.tasks if t.attempts]
    return store.attempts_by_task(task_ids=task_ids) if task_ids else {}


def job_out(store: JobQueue, job: JobRecord, workers: Sequence[WorkerRecord] | None = None,
            attempts: Mapping[int, Sequence[TaskAttemptRecord]] | None = None) -> JobOut:
    """The job as served: each task's attempts with their reasons, and why the job waits (when it does).

    ``workers``: the live workers (``store.list_workers()``), read when needed and not given; ``attempts``:
    :func:`task_attempts` of the job (or of a page of jobs holding it), read when not given. Raises what the
    store raises."""
    if attempts is None:
        attempts = task_attempts(store, [job])
    waiting = None
    if job.state in ACTIVE_JOB_STATES and not job.workers:
        live = store.list_workers() if workers is None else workers
        waiting = waiting_reason(job, live, attempts, datetime.now(timezone.utc))
    return JobOut.of(job, attempts, waiting)
