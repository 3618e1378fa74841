"""Mixed fleets with real worker processes on PostgreSQL: workers that lack a job's template, have another
version of it, or cannot import it, beside one that can run it (tests/fixtures/fleet_templates.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.fixtures import fleet_templates
from tests.fixtures.faults import FaultDatabase, Outcome, submit, wait_job
from tests.fixtures.processes import env, start_worker, stop_all, wait_for
from tuner import db

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
WORKER_ARGS = ("--heartbeat", "1", "--lease", "5")
MISSING = "No module named 'tests.fixtures.no_such_module'"  # the broken worker's reason


def _task(store: db.Store, job_id: int) -> db.TaskRecord:
    with store.session(readonly=True) as session:
        job = db.get_job(session, job_id=job_id)
    assert job is not None
    return job.tasks[0]


def test_only_capable_workers_run_a_job_and_one_that_cannot_import_it_gives_it_up(
    fault_db: FaultDatabase, tmp_path: Path
) -> None:
    """Beside a worker without the template and one with version 0, a worker whose implementation does not
    import claims the job and gives it up (one attempt, its reason recorded); a capable worker started later
    does the job: done, exactly its trials measured, by it alone."""
    store = db.Store.open(fault_db.url())
    job_id = submit(store, trials=6)
    names = ("lacking", "old", "broken", "capable")
    envs = (fleet_templates.lacking_env(), fleet_templates.old_version_env(), fleet_templates.broken_env(), env())
    logs = {name: tmp_path / f"{name}.log" for name in names}
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, environ in zip(names[:3], envs[:3], strict=True):
            workers[name] = start_worker(fault_db.url(), *WORKER_ARGS, log=logs[name], environ=environ)
        wait_for(lambda: _task(store, job_id).attempts == 1, 180, "the broken worker giving the task up")
        wait_for(lambda: len(store.list_workers()) == 3, 180, "three workers registered")
        workers["capable"] = start_worker(fault_db.url(), *WORKER_ARGS, log=logs["capable"], environ=envs[3])
        outcome = wait_job(store, job_id, 300)
        alive = {name: w.poll() is None for name, w in workers.items()}
    finally:
        codes = stop_all(list(workers.values()))
    texts = {name: log.read_text() for name, log in logs.items()}
    dump = "\n".join(f"--- {n}\n{t[-2500:]}" for n, t in texts.items())
    assert outcome == Outcome("done", 6, 6, 0), (outcome, dump)
    assert all(alive.values()) and codes == [0, 0, 0, 0] and not any("Traceback" in t for t in texts.values()), dump
    by_pid = {w.pid: w for w in store.list_workers(include_stopped=True)}
    ids = {name: by_pid[p.pid].id for name, p in workers.items()}
    assert fleet_templates.WIDE not in (by_pid[workers["lacking"].pid].templates or {"": ""})
    assert (by_pid[workers["old"].pid].templates or {})[fleet_templates.WIDE] == "0"
    task = _task(store, job_id)
    (attempt,) = store.list_attempts(task_id=task.id)
    assert attempt.worker_id == ids["broken"] and MISSING in attempt.reason, attempt
    assert task.attempts == 1 and task.error is None
    measured_by = {m.worker for m in store.list_measurements(study_id=task.study_id or -1, role="trial")}
    assert measured_by == {f"{by_pid[workers['capable'].pid].host}/{workers['capable'].pid}"}, measured_by
    store.close()


def test_a_job_no_worker_can_import_fails_after_k_distinct_workers_with_every_reason(
    fault_db: FaultDatabase, tmp_path: Path
) -> None:
    """TUNER_TASK_ATTEMPTS=2 and two workers that cannot import the template: the job fails once both gave it
    up, its error naming both workers and their reason; the workers stay up."""
    store = db.Store.open(fault_db.url())
    job_id = submit(store, trials=4)
    environ = {**fleet_templates.broken_env(), "TUNER_TASK_ATTEMPTS": "2"}
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    workers = [start_worker(fault_db.url(), *WORKER_ARGS, log=log, environ=environ) for log in logs]
    try:
        outcome = wait_job(store, job_id, 180)
        alive = [w.poll() is None for w in workers]
    finally:
        codes = stop_all(workers)
    dump = "\n".join(log.read_text()[-2500:] for log in logs)
    assert outcome.state == "failed" and outcome.trials_done == 0, (outcome, dump)
    assert alive == [True, True] and codes == [0, 0], dump
    with store.session(readonly=True) as session:
        job = db.get_job(session, job_id=job_id)
    assert job is not None and job.tasks[0].attempts == 2
    ids = [w.id for w in store.list_workers(include_stopped=True)]
    assert len(ids) == 2 and all(f"{i}: " in (job.error or "") for i in ids), job.error
    assert (job.error or "").count(MISSING) == 2, job.error
    store.close()
