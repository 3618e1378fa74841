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


def _withdrew(store: db.Store, *workers: subprocess.Popen[bytes]) -> bool:
    """Every one of these workers has registered and no longer advertises the wide template."""
    advertised = {w.pid: w.templates for w in store.list_workers(include_stopped=True)}
    return all(w.pid in advertised and fleet_templates.WIDE not in (advertised[w.pid] or {fleet_templates.WIDE: ""})
               for w in workers)


def test_only_capable_workers_run_a_job_and_one_that_cannot_import_it_withdraws_it(
    fault_db: FaultDatabase, tmp_path: Path
) -> None:
    """Beside a worker without the template and one with version 0, a worker whose implementation does not
    import claims the job and stops advertising the template (nothing charged to the task); a capable worker
    started later does the job: done, exactly its trials measured, by it alone."""
    store = db.Store.open(fault_db.url())
    job_id = submit(store, trials=6)
    names = ("lacking", "old", "broken", "capable")
    envs = (fleet_templates.lacking_env(), fleet_templates.old_version_env(), fleet_templates.broken_env(), env())
    logs = {name: tmp_path / f"{name}.log" for name in names}
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, environ in zip(names[:3], envs[:3], strict=True):
            workers[name] = start_worker(fault_db.url(), *WORKER_ARGS, log=logs[name], environ=environ)
        wait_for(lambda: len(store.list_workers()) == 3, 180, "three workers registered")
        wait_for(lambda: _withdrew(store, workers["broken"]), 180, "the broken worker withdrawing the template")
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
    assert fleet_templates.WIDE not in (by_pid[workers["lacking"].pid].templates or {"": ""})
    assert (by_pid[workers["old"].pid].templates or {})[fleet_templates.WIDE] == "0"
    assert MISSING in texts["broken"], texts["broken"][-2500:]
    task = _task(store, job_id)
    assert store.list_attempts(task_id=task.id) == [] and task.attempts == 0 and task.error is None
    measured_by = {m.worker for m in store.list_measurements(study_id=task.study_id or -1, role="trial")}
    assert measured_by == {f"{by_pid[workers['capable'].pid].host}/{workers['capable'].pid}"}, measured_by
    store.close()


def test_workers_that_cannot_import_a_template_do_not_fail_a_job_a_capable_worker_runs(
    fault_db: FaultDatabase, tmp_path: Path
) -> None:
    """A capable worker is mid-sweep when three workers that cannot import the template join, each with
    TUNER_TASK_ATTEMPTS=1 (a worker's own setting counts for nothing: the job's is 1 too): they withdraw the
    template, nothing is charged, and the capable worker finishes the job with every trial measured."""
    store = db.Store.open(fault_db.url())
    job_id = submit(store, trials=160, max_attempts=1)
    logs = [tmp_path / f"w{i}.log" for i in range(4)]
    capable = start_worker(fault_db.url(), *WORKER_ARGS, log=logs[0], environ=env())
    workers = [capable]
    try:
        wait_for(lambda: _task(store, job_id).trials_done >= 2, 180, "the capable worker measuring")
        environ = {**fleet_templates.broken_env(), "TUNER_TASK_ATTEMPTS": "1"}
        broken = [start_worker(fault_db.url(), *WORKER_ARGS, log=log, environ=environ) for log in logs[1:]]
        workers += broken
        wait_for(lambda: _withdrew(store, *broken), 180, "the broken workers withdrawing the template")
        mid = _task(store, job_id)
        outcome = wait_job(store, job_id, 300)
        alive = [w.poll() is None for w in workers]
    finally:
        codes = stop_all(workers)
    dump = "\n".join(log.read_text()[-2500:] for log in logs)
    assert mid.state == "running" and mid.trials_done < 160, (mid, dump)
    assert outcome == Outcome("done", 160, 160, 0), (outcome, dump)
    assert alive == [True] * 4 and codes == [0] * 4, dump
    task = _task(store, job_id)
    assert task.attempts == 0 and store.list_attempts(task_id=task.id) == []
    store.close()
