"""Reaping a worker that is still alive races with its own slot writes (PostgreSQL, READ COMMITTED): the
reaper gives back exactly the slots it deleted, never one the worker released or spent meanwhile."""

from __future__ import annotations

import threading
import time

import pytest

from tuner import db
from tuner.db import jobs, measurements
from tuner.store.records import NewMeasurement


def _setup(url: str) -> tuple[db.Store, int, int]:
    store = db.Store.open(url)
    job = store.create_job(template="t", template_version="1", backend="triton", device_kind="cpu",
                           device_name=None, trials=5, sampler="random", samples=3, candidate_timeout_s=10,
                           tasks=[("a", "a", '{"n":1}')])
    task_id = job.tasks[0].id
    store.register_worker(worker_id="W", host="h", pid=1, device_kind="cpu", device_name="x", device_index=0,
                          backends=["triton"], fingerprint_hash="f", fingerprint_json="{}", lease_s=0.01)
    store.claim_task(worker_id="W", device_kind="cpu", device_name="x", backends=["triton"])
    first = store.reserve_slot(task_id=task_id, worker_id="W")
    assert first is not None and store.reserve_slot(task_id=task_id, worker_id="W") is not None
    time.sleep(0.05)  # the lease has lapsed: the worker is reapable while it still writes
    return store, task_id, first


@pytest.mark.postgres
@pytest.mark.parametrize("write", ["release", "spend"])
def test_a_reap_meanwhile_a_slot_write_gives_back_only_what_it_deleted(postgres_sandbox, write: str) -> None:  # type: ignore[no-untyped-def]
    store, task_id, slot = _setup(postgres_sandbox.new_url())
    with store.session() as session:  # the worker's own transaction, open while the reaper runs
        if write == "release":
            jobs.release_slot(session, slot_id=slot)
        else:
            study = store.get_or_create_study(
                name="st", template="t", template_version="1", shape_key="a", shape_json='{"n":1}',
                device_kind="cpu", device_name="x", fingerprint_hash="f", fingerprint_json="{}")
            row = measurements.add_new(session, NewMeasurement(
                study_id=study.id, role="trial", candidate="config", config_json='{"a":1}', status="OK",
                trial_number=0, median_us=1.0))
            jobs.complete_slot(session, slot_id=slot, trial_number=0, measurement_id=row.id, ok=True,
                               median_us=1.0, config_json='{"a":1}')
        reaped: list[list[str]] = []
        reaper = threading.Thread(target=lambda: reaped.append(store.reap_lost_workers()))
        reaper.start()
        time.sleep(1.0)  # the reaper now waits on the rows this transaction holds
    reaper.join(timeout=60)
    assert reaped == [["W"]]
    task = store.get_task(task_id=task_id)
    # released: both slots are back (0 reserved, not -1); spent: the measured one stays (done <= reserved)
    expected = (0, 0) if write == "release" else (1, 1)
    assert (task.trials_reserved, task.trials_done) == expected, task
    store.close()


@pytest.mark.postgres
@pytest.mark.parametrize("write", ["claim", "finish"])
def test_a_cancel_meanwhile_a_write_holding_a_task_then_its_job_does_not_deadlock(postgres_sandbox, write: str) -> None:  # type: ignore[no-untyped-def]
    """A job's first claim and a task's finish lock the task's row, then the job's; a cancel locked the job's,
    then its tasks': the two deadlocked and PostgreSQL failed one (the API's cancel answered 503). The cancel
    now takes the tasks first: it waits for the write, then cancels, and both succeed."""
    from sqlalchemy import select, update

    from tuner.db.models import JobRow, TaskRow

    store = db.Store.open(postgres_sandbox.new_url())
    job = store.create_job(template="t", template_version="1", backend="triton", device_kind="cpu",
                           device_name=None, trials=5, sampler="random", samples=3, candidate_timeout_s=10,
                           tasks=[("a", "a", '{"n":1}'), ("b", "b", '{"n":2}')])
    cancelled: list[object] = []
    with store.session() as session:  # the write's transaction: its task first
        task = session.scalars(select(TaskRow).where(TaskRow.id == job.tasks[0].id).with_for_update()).one()
        canceller = threading.Thread(target=lambda: cancelled.append(_cancel(store, job.id)))
        canceller.start()
        time.sleep(1.0)  # the cancel now waits on the rows this transaction holds
        task.state = "running" if write == "claim" else "done"
        session.execute(update(JobRow).where(JobRow.id == job.id).values(state="running"))  # then its job
    canceller.join(timeout=60)
    assert not canceller.is_alive() and len(cancelled) == 1
    assert not isinstance(cancelled[0], Exception), cancelled[0]
    after = store.get_job(job_id=job.id)
    expected = ["cancelled", "cancelled"] if write == "claim" else ["done", "cancelled"]
    assert after.state == "cancelled" and [t.state for t in after.tasks] == expected
    store.close()


def _cancel(store: db.Store, job_id: int) -> object:
    try:
        return store.cancel_job(job_id=job_id)
    except Exception as exc:  # returned: the thread's caller asserts on it
        return exc


@pytest.mark.postgres
def test_submissions_racing_on_a_new_idempotency_key_create_one_job(postgres_sandbox) -> None:  # type: ignore[no-untyped-def]
    """Eight threads create the same job under one new key at once (a client's retries reaching several API
    processes): one job is created, every other call is refused with RecordConflictError (its insert meets
    the key), and the key then names that one job."""
    from tuner.errors import RecordConflictError

    store = db.Store.open(postgres_sandbox.new_url())
    go, found, errors = threading.Barrier(8), [], []

    def create() -> None:
        go.wait()
        try:
            found.append(store.create_job(
                template="t", template_version="1", backend="triton", device_kind="cpu", device_name=None,
                trials=5, sampler="random", samples=3, candidate_timeout_s=10, tasks=[("a", "a", '{"n":1}')],
                idempotency_key="same", request_hash="h").id)
        except Exception as exc:  # collected: a thread's assertion would be lost
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(found) == 1 and len(errors) == 7 and all(isinstance(e, RecordConflictError) for e in errors), errors
    assert store.count_jobs() == 1 and store.job_with_key(idempotency_key="same").id == found[0]
    store.close()


@pytest.mark.postgres
def test_a_cancel_meanwhile_a_worker_stops_and_settles_a_given_up_task_does_not_deadlock(postgres_sandbox) -> None:  # type: ignore[no-untyped-def]
    """A worker stopping settles the tasks every allowed worker gave up (``_settle_given_up``); it locked a job,
    then updated its task, while a cancel holding the job's tasks waited for the job: a deadlock. It locks
    the tasks first now, as every write of the queue does."""
    from sqlalchemy import event

    store = db.Store.open(postgres_sandbox.new_url())
    job = store.create_job(template="t", template_version="1", backend="triton", device_kind="cpu",
                           device_name=None, trials=2, sampler="tpe", samples=10, candidate_timeout_s=60.0,
                           tasks=[("w0", "n=0", '{"n": 0}')], max_attempts=1)
    for worker in ("A", "B"):
        store.register_worker(worker_id=worker, host="h", pid=1, device_kind="cpu", device_name="CPU",
                              device_index=0, backends=["triton"], fingerprint_hash="f", fingerprint_json="{}",
                              lease_s=600.0)
    claim = store.claim_task(worker_id="A", device_kind="cpu", device_name="CPU", backends=["triton"])
    store.fail_attempt(task_id=claim.task.id, worker_id="A", reason="device gone")  # B may still take it
    role = threading.local()

    @event.listens_for(store.engine, "before_cursor_execute")
    def widen(conn, cursor, statement, params, context, executemany):  # type: ignore[no-untyped-def]
        if getattr(role, "name", None) == "cancel" and "FROM tuner_jobs" in statement and "FOR UPDATE" in statement:
            time.sleep(1.0)  # the cancel holds the tasks; it asks for the job next

    out: dict[str, object] = {}

    def cancel() -> None:
        role.name = "cancel"
        out["cancel"] = _cancel(store, job.id)

    def stop() -> None:
        time.sleep(0.3)
        try:
            store.stop_worker(worker_id="B")
            out["stop"] = "ok"
        except Exception as exc:
            out["stop"] = exc

    threads = [threading.Thread(target=cancel), threading.Thread(target=stop)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert out["stop"] == "ok" and not isinstance(out["cancel"], Exception), out
    assert store.get_job(job_id=job.id).state in ("cancelled", "failed")
    store.close()
