"""``GET /v1/workers``: the workers serving the queue, with their lease (``lost`` once it has expired)."""

from __future__ import annotations

from fastapi import APIRouter

from tuner.api.deps import Reader, StoreDep
from tuner.api.schemas import WorkerOut

router = APIRouter(tags=["workers"])


@router.get("/workers", response_model=list[WorkerOut], summary="Workers, newest first")
def list_workers(_: Reader, store: StoreDep, include_stopped: bool = False) -> list[WorkerOut]:
    now = store.clock()  # leases are the store's clock's
    workers = store.list_workers(include_stopped=include_stopped)
    jobs = {
        w.current_task_id: getattr(store.get_task(task_id=w.current_task_id), "job_id", None)
        for w in workers if w.current_task_id is not None
    }
    out = []
    for w in workers:
        expired = w.state in ("idle", "busy") and w.lease_expires_at < now
        out.append(WorkerOut(
            id=w.id, host=w.host, pid=w.pid, device_kind=w.device_kind, device_name=w.device_name,
            device_index=w.device_index, backends=w.backends, fingerprint=w.fingerprint_hash,
            state="lost" if expired else w.state,  # type: ignore[arg-type]
            lease_expired=expired or w.state == "lost", last_heartbeat=w.last_heartbeat,
            lease_expires_at=w.lease_expires_at, started_at=w.started_at, current_task_id=w.current_task_id,
            current_job_id=jobs.get(w.current_task_id) if w.current_task_id is not None else None,
            templates=w.templates,
        ))
    return out
