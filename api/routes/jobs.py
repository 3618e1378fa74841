"""``/v1/jobs``: submit jobs (tuning, or verifying published bests) to the store's queue, follow them, cancel them.

A job is validated completely (template, workloads, shapes, bounds) before anything is written; workers
whose device and backends match claim its tasks (one per shape) from the database.

A submission may carry an ``Idempotency-Key`` header (1–128 visible ASCII characters, e.g. a UUID): the
same request sent again under it (a client that lost the answer, racing or not) gets the job it created,
200 with ``Idempotent-Replayed: true``, and no second job is queued; another request under that key (another
body, or another submitter) is 409. The key is kept with the job for good.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Response, status

from tuner.api.catalog import CatalogEntry
from tuner.api.deps import CatalogDep, Reader, StoreDep, Submitter
from tuner.api.errors import FieldError
from tuner.api.jobs_view import job_out, task_attempts, task_verifications
from tuner.api.schemas import MAX_ID, MAX_OFFSET, JobIn, JobOut, JobPage, JobState
from tuner.errors import RecordConflictError, UnknownTemplateError, UserInputError
from tuner.frozen import Shape
from tuner.settings import engine_settings
from tuner.store import JobQueue, JobRecord, TuningStore
from tuner.store.records import ACTIVE_JOB_STATES, repeated

router = APIRouter(tags=["jobs"])
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="A job's id.")]
IdempotencyKey = Annotated[str | None, Header(
    alias="Idempotency-Key", min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$",
    description="The same request sent again under this key gets the job it created (200, "
                "Idempotent-Replayed: true) instead of a second job; another request under it is 409.")]
MAX_LABEL, MAX_SHAPE_KEY = 256, 1024  # the store's columns (tuner_tasks.label, shape_key)
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "No or unknown bearer token"},
    403: {"description": "The token lacks the 'submit' scope"},
    503: {"description": "The store is unreachable"},
}


@router.post(
    "/jobs", status_code=status.HTTP_201_CREATED, response_model=JobOut, summary="Submit a tuning or verify job",
    responses={**_ERRORS, 200: {"description": "A repeat under its Idempotency-Key: the job it created",
                                "model": JobOut},
               404: {"description": "Unknown template"},
               409: {"description": "The Idempotency-Key was used for another request"},
               413: {"description": "Body too large"}, 422: {"description": "Invalid job (field-level messages)"}},
)
def submit(body: JobIn, response: Response, who: Submitter, catalog: CatalogDep, store: StoreDep,
           idempotency_key: IdempotencyKey = None) -> JobOut:
    try:
        entry = catalog.get(body.template)
    except UnknownTemplateError as exc:
        raise FieldError.wrap(exc, ("body", "template")) from None
    shapes = _shapes(entry, body)
    if body.kind == "verify":
        _check_published(store, entry, body, shapes)
    tasks = [(label, shape.key(), shape.to_json()) for label, shape in shapes]
    digest = request_hash(who.label, body) if idempotency_key is not None else None
    try:
        job = _create(store, entry, body, tasks, who.label,
                      {"idempotency_key": idempotency_key, "request_hash": digest})
    except RecordConflictError:  # the key is taken (only a key conflicts here): a repeat, or another request
        found = None if idempotency_key is None else store.job_with_key(idempotency_key=idempotency_key)
        if found is None or idempotency_key is None:
            raise
        job = repeated(found, idempotency_key, digest)  # RecordConflictError (409) for another request
        response.status_code = status.HTTP_200_OK
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job_out(store, job)


def _create(store: JobQueue, entry: CatalogEntry, body: JobIn, tasks: list[tuple[str, str, str]],
            submitter: str | None, keyed: dict[str, Any]) -> JobRecord:
    """The job of a validated body (a tuning or a verify job), queued in the store; RecordConflictError when
    its idempotency key is taken."""
    if body.kind == "verify":
        return store.create_verify_job(
            template=entry.name, template_version=entry.spec.version, backend=entry.spec.backend,
            device_kind=body.device.kind, device_name=body.device.name, tasks=tasks, processes=body.processes,
            samples=body.samples, candidate_timeout_s=body.candidate_timeout_s, comparators=body.comparators,
            priority=body.priority, submitted_by=submitter, max_attempts=engine_settings().task_attempts,
            comparator_processes=body.comparator_processes, **keyed,
        )
    return store.create_job(
        template=entry.name, template_version=entry.spec.version, backend=entry.spec.backend,
        device_kind=body.device.kind, device_name=body.device.name, trials=body.trials, sampler=body.sampler,
        samples=body.samples, candidate_timeout_s=body.candidate_timeout_s, tasks=tasks, seed=body.seed,
        finalists=body.finalists, comparators=body.comparators, priority=body.priority,
        submitted_by=submitter, max_attempts=engine_settings().task_attempts, **keyed,
    )


def _check_published(store: TuningStore, entry: CatalogEntry, body: JobIn, shapes: list[tuple[str, Shape]]) -> None:
    """A verify job re-measures published bests: one for a shape without a best of the template's current
    version on the device kind could only fail on the worker ("run tuner tune first"); refused here (422)."""
    missing = [label for label, shape in shapes
               if store.get_best(template=entry.name, shape_key=shape.key(), device_kind=body.device.kind,
                                 template_version=entry.spec.version) is None]
    if missing:
        raise FieldError(
            f"no best config of {entry.name}@{entry.spec.version} is published on {body.device.kind} for "
            f"{', '.join(missing)}: nothing to verify; tune it first (a tuning job, or `tuner tune`)",
            ("body", "shapes" if body.shapes else "workloads"))


def request_hash(submitter: str | None, body: JobIn) -> str:
    """What an idempotency key is bound to: the submitter and the body as validated (its defaults filled, so
    a repeat that spells a default out is the same request). Hex SHA-256."""
    text = json.dumps({"by": submitter, "body": body.model_dump(mode="json")}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _shapes(entry: CatalogEntry, body: JobIn) -> list[tuple[str, Shape]]:
    """(label, shape) per task, in the body's order, duplicates merged; FieldError locates each bad one."""
    selected: list[tuple[str, Shape]] = []
    for i, name in enumerate(body.workloads):
        try:
            selected.append((name, entry.spec.workload(name)))
        except UserInputError as exc:
            raise FieldError.wrap(exc, ("body", "workloads", i)) from None
    for i, raw in enumerate(body.shapes):
        try:
            shape = entry.spec.make_shape(raw)
        except UserInputError as exc:
            raise FieldError.wrap(exc, ("body", "shapes", i)) from None
        label = entry.spec.workload_name(shape) or shape.key()
        if len(shape.key()) > MAX_SHAPE_KEY or len(label) > MAX_LABEL:
            raise FieldError(f"shape too long to store: {len(shape.key())} characters as text, at most "
                             f"{min(MAX_LABEL, MAX_SHAPE_KEY)}", ("body", "shapes", i))
        selected.append((label, shape))
    if not selected:
        raise FieldError("give at least one workload or shape", ("body", "shapes"))
    unique: dict[Shape, str] = {}
    for label, shape in selected:
        unique.setdefault(shape, label)
    return [(label, shape) for shape, label in unique.items()]


@router.get("/jobs", response_model=JobPage, summary="List jobs, newest first", responses=_ERRORS)
def list_jobs(
    _: Reader,
    store: StoreDep,
    state: JobState | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> JobPage:
    jobs = store.list_jobs(state=state, limit=limit, offset=offset)
    total = store.count_jobs(state=state)
    active = any(j.state in ACTIVE_JOB_STATES for j in jobs)
    workers = store.list_workers() if active else []
    attempts = task_attempts(store, jobs)  # one read for the page, not one per task
    verifications = task_verifications(store, jobs)  # likewise
    now = store.clock() if active else None  # read once for the page (a waiting job judges leases by it)
    return JobPage(items=[job_out(store, j, workers, attempts, verifications, now) for j in jobs], total=total,
                   limit=limit, offset=offset)


@router.get("/jobs/{job_id}", response_model=JobOut, summary="One job: state, progress per shape, best so far",
            responses={**_ERRORS, 404: {"description": "No such job"}})
def get_job(job_id: JobId, _: Reader, store: StoreDep) -> JobOut:
    job = store.get_job(job_id=job_id)
    if job is None:
        raise FieldError(f"no job {job_id}", ("path", "job_id"), status=404, kind="not_found")
    return job_out(store, job)


@router.post("/jobs/{job_id}/cancel", response_model=JobOut, summary="Cancel a queued or running job",
             responses={**_ERRORS, 404: {"description": "No such job"}, 409: {"description": "Already finished"}})
def cancel(job_id: JobId, _: Submitter, store: StoreDep) -> JobOut:
    job = store.cancel_job(job_id=job_id)
    return job_out(store, job)

