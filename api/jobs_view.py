"""A job as the API serves it (:class:`tuner.api.schemas.JobOut`): each task's attempts with their reasons,
what a verify task's verification found, and why the job waits. Shared by the ``/v1/jobs`` routes and the job
page, so that both say the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Literal

from tuner.api.schemas import JobOut, TaskVerificationOut
from tuner.store import JobQueue, JobRecord, TaskAttemptRecord, VerificationRecord, WorkerRecord
from tuner.store.entries import summary_of
from tuner.store.records import ACTIVE_JOB_STATES, VERIFIED_LABEL, Status, waiting_reason

Verdict = Literal["right", "drifted", "wrong", "not measured"]  # TaskVerificationOut.verdict


def task_attempts(store: JobQueue, jobs: Sequence[JobRecord]) -> dict[int, list[TaskAttemptRecord]]:
    """The attempts of each task of these jobs that has any, by task id: one read for all the jobs (none when
    no task has an attempt). Raises what the store raises (:class:`tuner.errors.StoreError`)."""
    task_ids = [t.id for job in jobs for t in job.tasks if t.attempts]
    return store.attempts_by_task(task_ids=task_ids) if task_ids else {}


def task_verifications(store: JobQueue, jobs: Sequence[JobRecord]) -> dict[int, TaskVerificationOut]:
    """What the verification of each verify task of these jobs that recorded one found, by task id: one read
    for all the jobs (none when no task recorded one). Raises what the store raises."""
    task_ids = [t.id for job in jobs for t in job.tasks if t.verification_id is not None]
    found = store.verifications_by_task(task_ids=task_ids) if task_ids else {}
    return {task_id: verification_out(check) for task_id, check in found.items()}


def verification_out(check: VerificationRecord) -> TaskVerificationOut:
    """What a verification found: its verdict on the config, the first failing process's reason, and both in
    a sentence with the device and the figures."""
    verified = [c for p in check.figures for c in p.get("candidates", ()) if c.get("label") == VERIFIED_LABEL]
    failing = sorted((c for c in verified if c.get("status") != Status.OK.value),
                     key=lambda c: c.get("status") != Status.WRONG_RESULT.value)  # a wrong result first
    reason = next((str(c["reason"]) for c in failing if c.get("reason")), None)
    where = f"{check.processes} fresh process{'es' if check.processes != 1 else ''} on {check.device_name}"
    tolerance = f"±{100 * check.tolerance:g}%"
    verdict: Verdict
    if check.wrong_processes:
        verdict, summary = "wrong", f"wrong results in {check.wrong_processes} of {where}"
    elif check.median_us is None or check.drift is None:
        verdict, summary = "not measured", f"did not measure OK in any of {where}"
    else:
        verdict = "drifted" if check.flagged else "right"
        summary = (f"{'drifted' if check.flagged else 'right'}: {check.median_us:.2f} µs over {where}, "
                   f"{100 * check.drift:+.1f}% against {check.stored_us:.2f} µs stored (tolerance {tolerance})")
    if reason is not None and verdict in ("wrong", "not measured"):
        summary += f": {reason}"
    return TaskVerificationOut(**summary_of(check), id=check.id, study_id=check.study_id, config=check.config,
                               verdict=verdict, reason=reason, summary=summary)


def job_out(store: JobQueue, job: JobRecord, workers: Sequence[WorkerRecord] | None = None,
            attempts: Mapping[int, Sequence[TaskAttemptRecord]] | None = None,
            verifications: Mapping[int, TaskVerificationOut] | None = None, now: datetime | None = None) -> JobOut:
    """The job as served: each task's attempts with their reasons, what its verification found (a verify
    task's), and why the job waits (when it does).

    ``workers``: the live workers (``store.list_workers()``), read when needed and not given; ``attempts``:
    :func:`task_attempts` of the job (or of a page of jobs holding it), read when not given; ``verifications``
    likewise :func:`task_verifications`; ``now``: the store's clock (:meth:`JobQueue.clock`, read when needed
    and not given: a page of jobs reads it once). Raises what the store raises."""
    if attempts is None:
        attempts = task_attempts(store, [job])
    if verifications is None:
        verifications = task_verifications(store, [job])
    waiting = None
    if job.state in ACTIVE_JOB_STATES and not job.workers:
        live = store.list_workers() if workers is None else workers
        waiting = waiting_reason(job, live, attempts, store.clock() if now is None else now)
    return JobOut.of(job, attempts, waiting, verifications)
