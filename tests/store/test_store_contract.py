"""The store contract (tuner.store.TuningStore and JobQueue), one suite run on every implementation: the
in-memory store, SQLite and PostgreSQL. A behaviour the engine relies on is tested here, once."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.fixtures import databases
from tests.fixtures.statements import select_statements
from tests.fixtures.studies import study_fields
from tuner.errors import NotFoundError, RecordConflictError, SlotLostError
from tuner.store import JobQueue, NewMeasurement, StudyRecord, TuningStore
from tuner.store.memory import MemoryStore
from tuner.store.records import VERIFIED_LABEL, Status, claimable_tasks


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
        return
    from tuner import db

    if request.param == "sqlite":
        url = databases.sqlite_file_url(tmp_path / "tuner.db")
    else:
        url = request.getfixturevalue("postgres_sandbox").new_url()
    opened = db.Store.open(url)
    yield opened
    opened.close()


def _study(store: Any, **dims: Any) -> StudyRecord:
    return store.get_or_create_study(**study_fields(**dims))


def _m(study_id: int, **fields: Any) -> NewMeasurement:
    base: dict[str, Any] = {"role": "trial", "candidate": "config", "config_json": {"BLOCK_H": 4},
                            "status": Status.OK, "median_us": 5.0}
    return NewMeasurement(study_id=study_id, **{**base, **fields})


def _job(store: Any, *, trials: int = 2, shapes: int = 1, **fields: Any) -> Any:
    tasks = [(f"w{i}", f"n={i}", f'{{"n": {i}}}') for i in range(shapes)]
    base: dict[str, Any] = {"template": "t", "template_version": "1", "backend": "triton", "device_kind": "cpu",
                            "device_name": None, "trials": trials, "sampler": "tpe", "samples": 10,
                            "candidate_timeout_s": 60.0, "tasks": tasks}
    return store.create_job(**{**base, **fields})


def _worker(store: Any, worker_id: str = "w1", lease_s: float = 30.0, **fields: Any) -> str:
    store.register_worker(worker_id=worker_id, host="h", pid=1, device_kind="cpu", device_name="CPU",
                          device_index=0, backends=["triton"], fingerprint_hash="f", fingerprint_json="{}",
                          lease_s=lease_s, **fields)
    return worker_id


def _claim(store: Any, worker_id: str) -> Any:
    return store.claim_task(worker_id=worker_id, device_kind="cpu", device_name="CPU", backends=["triton"])


def test_both_protocols_are_implemented(store: Any) -> None:
    assert isinstance(store, TuningStore) and isinstance(store, JobQueue)


# -- studies ------------------------------------------------------------------------------------------------
def test_a_study_is_created_once_and_keeps_its_key(store: Any) -> None:
    first = _study(store)
    assert _study(store) == first
    assert store.get_study(study_id=first.id) == first == store.get_study(name=first.name)
    assert store.get_study(name="nope") is None and store.get_study(study_id=first.id + 1000) is None
    with pytest.raises(ValueError):
        store.get_study()
    other = study_fields(S=8192)
    with pytest.raises(RecordConflictError):  # the name of one key with the fields of another
        store.get_or_create_study(**{**other, "name": first.name})
    with pytest.raises(RecordConflictError):  # the key of a stored study under a new name
        store.get_or_create_study(**{**study_fields(), "name": "another name"})


def test_studies_are_listed_oldest_first_and_filtered(store: Any) -> None:
    a, b = _study(store), _study(store, S=8192)
    c = _study(store, template="mamba3_mimo_bwd")
    assert store.list_studies() == [a, b, c]
    assert store.list_studies(template="mamba2_chunk_cumsum") == [a, b]
    assert store.list_studies(device_kind="npu") == []


# -- measurements ---------------------------------------------------------------------------------------------
def test_a_measurement_round_trips_with_canonical_json(store: Any) -> None:
    study = _study(store)
    stored = store.record_measurement(_m(study.id, config_json='{"b": 1, "a": 2}', errors_json={"y": math.nan},
                                         kernels_json={"k": 1.5}, p20_us=4.0, p80_us=6.0, n_samples=3,
                                         timer="cupti", trial_number=7, worker="host/1"))
    assert stored.config_json == '{"a":2,"b":1}' and stored.status is Status.OK and stored.timer == "cupti"
    assert math.isnan(stored.errors["y"]) and stored.kernels == {"k": 1.5}
    assert (stored.trial_number, stored.worker, stored.n_samples) == (7, "host/1", 3)
    assert store.get_measurement(measurement_id=stored.id) == stored
    assert store.get_measurement(measurement_id=stored.id + 1000) is None


@pytest.mark.parametrize("bad", [{"role": "warmup"}, {"candidate": "mine"}, {"status": "GOOD"},
                                 {"config_json": "{not json"}, {"timer": "sundial"}])
def test_an_invalid_measurement_is_refused(store: Any, bad: dict[str, Any]) -> None:
    study = _study(store)
    with pytest.raises(ValueError):
        store.record_measurement(_m(study.id, **bad))
    assert store.count_measurements(study_id=study.id) == 0


def test_a_measurement_of_an_unknown_study_is_refused(store: Any) -> None:
    with pytest.raises(NotFoundError):
        store.record_measurement(_m(12345))


def test_a_reason_with_a_nul_or_a_lone_surrogate_is_kept_escaped(store: Any) -> None:
    """A compiler's message with a NUL byte or undecodable bytes (PostgreSQL's text refuses both) is stored
    with those written as escapes: refused, it failed the task on every worker as the caller's input."""
    study = _study(store)
    m = store.record_measurement(_m(study.id, status=Status.COMPILE_ERROR, median_us=None,
                                    reason="ptxas\x00 said \udcff é"))
    assert m.reason == "ptxas\\x00 said \\udcff é"
    assert store.list_measurements(study_id=study.id)[0].reason == m.reason


def test_a_task_error_or_attempt_reason_with_a_nul_or_a_lone_surrogate_is_kept_escaped(store: Any) -> None:
    """The same text reaches a task's error and a worker's attempt reason (a MeasureSetupError's message):
    refused there, the worker's own failure path raised and the task stayed running for every worker."""
    job = _job(store, shapes=3)
    a, b, c = (t.id for t in job.tasks)
    store.fail_task(task_id=a, error="setup\x00failed")
    _worker(store, "w1")
    assert store.fail_attempt(task_id=b, worker_id="w1", reason="bad \udcff byte") is not None
    tasks = {t.id: t for t in store.get_job(job_id=job.id).tasks}
    assert tasks[a].error == "setup\\x00failed" and tasks[c].error is None
    assert [x.reason for x in store.list_attempts(task_id=b)] == ["bad \\udcff byte"]


def test_measurements_are_filtered_ordered_and_paged(store: Any) -> None:
    study, other = _study(store), _study(store, S=8192)
    slow = store.record_measurement(_m(study.id, median_us=9.0))
    fast = store.record_measurement(_m(study.id, median_us=2.0, config_json={"BLOCK_H": 8}))
    crash = store.record_measurement(_m(study.id, status=Status.RUNTIME_ERROR, median_us=None, reason="boom"))
    final = store.record_measurement(_m(study.id, role="final", round_id="r1", median_us=2.1))
    store.record_measurement(_m(other.id))
    ids = lambda rows: [r.id for r in rows]  # noqa: E731
    assert ids(store.list_measurements(study_id=study.id)) == [slow.id, fast.id, crash.id, final.id]
    assert ids(store.list_measurements(study_id=study.id, order="-id")) == [final.id, crash.id, fast.id, slow.id]
    assert ids(store.list_measurements(study_id=study.id, order="median_us")) == [fast.id, final.id, slow.id,
                                                                                  crash.id]
    assert ids(store.list_measurements(study_id=study.id, role="trial", status=Status.OK)) == [slow.id, fast.id]
    assert ids(store.list_measurements(study_id=study.id, config_json='{"BLOCK_H":8}')) == [fast.id]
    assert ids(store.list_measurements(study_id=study.id, limit=2, offset=1)) == [fast.id, crash.id]
    assert store.count_measurements(study_id=study.id, role="trial") == 3
    assert store.count_measurements(study_id=study.id, status="RUNTIME_ERROR") == 1
    with pytest.raises(ValueError):
        store.list_measurements(study_id=study.id, order="fastest")


def test_the_latest_final_round_is_the_one_holding_the_newest_final_row(store: Any) -> None:
    study = _study(store)
    assert store.latest_round(study_id=study.id) == []
    store.record_measurement(_m(study.id, role="final", round_id="r1"))
    a = store.record_measurement(_m(study.id, role="final", round_id="r2"))
    b = store.record_measurement(_m(study.id, role="final", round_id="r2", candidate="default"))
    store.record_measurement(_m(study.id))
    assert [r.id for r in store.latest_round(study_id=study.id)] == [a.id, b.id]


def test_round_defaults_give_each_final_measurement_its_rounds_default_figure(store: Any) -> None:
    study = _study(store)

    def final(candidate: str, median: float | None, round_id: str, **fields: Any) -> int:
        return int(store.record_measurement(_m(study.id, role="final", candidate=candidate, median_us=median,
                                                round_id=round_id, **fields)).id)

    best_a, default_a = final("config", 2.0, "a"), final("default", 3.0, "a")
    best_b = final("config", 2.0, "b")
    final("default", None, "b", status=Status.TIMEOUT)  # the default failed in round b: no figure
    default_c = final("default", 4.0, "c")  # the default won round c: its own figure
    trial = store.record_measurement(_m(study.id)).id
    got = store.round_defaults(measurement_ids=[best_a, default_a, best_b, default_c, trial, 10_000])
    assert got == {best_a: 3.0, default_a: 3.0, default_c: 4.0}
    assert store.round_defaults(measurement_ids=[]) == {}


# -- best configs ---------------------------------------------------------------------------------------------
def test_publishing_replaces_the_studys_best_and_is_served_newest_first(store: Any) -> None:
    study, other = _study(store), _study(store, S=8192)
    first = store.record_measurement(_m(study.id, median_us=4.0))
    second = store.record_measurement(_m(study.id, median_us=3.0, config_json={"BLOCK_H": 8}))
    published = store.publish_best(study_id=study.id, measurement_id=first.id)
    assert (published.median_us, published.shape_key, published.template) == (4.0, study.shape_key, study.template)
    again = store.publish_best(study_id=study.id, measurement_id=second.id)
    assert store.get_study_best(study_id=study.id) == again and again.config == {"BLOCK_H": 8}
    assert store.get_best(template=study.template, shape_key=study.shape_key) == again
    assert store.get_best(template=study.template, shape_key=study.shape_key, device_name="other") is None
    store.publish_best(study_id=other.id, measurement_id=store.record_measurement(_m(other.id)).id)
    assert [b.shape_key for b in store.list_best(template=study.template)] == sorted([study.shape_key,
                                                                                     other.shape_key])
    assert store.list_best(device_kind="npu") == []


def test_withdrawing_a_best_unpublishes_it_and_keeps_its_measurements(store: Any) -> None:
    study, other = _study(store), _study(store, S=8192)
    m = store.record_measurement(_m(study.id))
    store.publish_best(study_id=study.id, measurement_id=m.id)
    kept = store.publish_best(study_id=other.id, measurement_id=store.record_measurement(_m(other.id)).id)
    assert store.withdraw_best(study_id=study.id) is True
    assert store.get_study_best(study_id=study.id) is None
    assert store.get_best(template=study.template, shape_key=study.shape_key) is None
    assert store.list_best(template=study.template) == [kept]  # the other study's best stays
    assert store.get_measurement(measurement_id=m.id) is not None
    assert store.withdraw_best(study_id=study.id) is False  # nothing left to withdraw
    assert store.publish_best(study_id=study.id, measurement_id=m.id).measurement_id == m.id  # publishable again


@pytest.mark.parametrize("fields", [{"status": Status.WRONG_RESULT}, {"median_us": None},
                                    {"candidate": "comparator:mamba_ssm"}])
def test_only_an_ok_timed_config_of_the_study_is_published(store: Any, fields: dict[str, Any]) -> None:
    study = _study(store)
    m = store.record_measurement(_m(study.id, **fields))
    with pytest.raises(RecordConflictError):
        store.publish_best(study_id=study.id, measurement_id=m.id)
    other = _study(store, S=8192)
    with pytest.raises(RecordConflictError):
        store.publish_best(study_id=other.id, measurement_id=store.record_measurement(_m(study.id)).id)
    with pytest.raises(NotFoundError):
        store.publish_best(study_id=study.id, measurement_id=m.id + 1000)
    assert store.get_study_best(study_id=study.id) is None


# -- the Optuna side ------------------------------------------------------------------------------------------
def test_withdrawing_fails_only_trials_still_waiting(store: Any) -> None:
    study = optuna.create_study(study_name="q", storage=store.optuna_storage(), direction="minimize")
    study.enqueue_trial({"x": 1})
    study.enqueue_trial({"x": 2})
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    running = study.ask()  # pops the first
    ids = [t._trial_id for t in waiting]
    assert store.withdraw_waiting_trials(ids) == {ids[1]}
    states = {t._trial_id: t.state for t in study.get_trials(deepcopy=False)}
    assert states == {ids[0]: optuna.trial.TrialState.RUNNING, ids[1]: optuna.trial.TrialState.FAIL}
    assert running._trial_id == ids[0]


# -- the job queue --------------------------------------------------------------------------------------------
def test_a_job_needs_distinct_shapes(store: Any) -> None:
    with pytest.raises(ValueError):
        _job(store, shapes=0)
    with pytest.raises(ValueError):
        store.create_job(**{"template": "t", "template_version": "1", "backend": "triton", "device_kind": "cpu",
                            "device_name": None, "trials": 1, "sampler": "tpe", "samples": 1,
                            "candidate_timeout_s": 1.0, "tasks": [("a", "n=1", "{}"), ("b", "n=1", "{}")]})


def test_an_idempotency_key_names_one_job_and_a_repeat_finds_it(store: Any) -> None:
    """A key is unique: a creation under a key taken (the same request again, or another) creates nothing and
    raises RecordConflictError; job_with_key finds the job, and ``repeated`` tells a repeat (the same
    request's hash: the job) from another request (RecordConflictError). Keys are the store's, whatever the
    job's kind."""
    from tuner.store.records import repeated

    first = _job(store, idempotency_key="k-1", request_hash="h")
    assert (first.idempotency_key, first.request_hash) == ("k-1", "h")
    for again in ({"request_hash": "h"}, {"request_hash": "other"}):
        with pytest.raises(RecordConflictError, match="is taken"):
            _job(store, idempotency_key="k-1", **again)
    with pytest.raises(RecordConflictError):  # a verify job under a tuning job's key, too
        store.create_verify_job(template="t", template_version="1", backend="triton", device_kind="cpu",
                                device_name=None, tasks=[("w0", "n=0", '{"n": 0}')], idempotency_key="k-1",
                                request_hash="h")
    found = store.job_with_key(idempotency_key="k-1")
    assert found.id == first.id and repeated(found, "k-1", "h").id == first.id
    with pytest.raises(RecordConflictError, match="was used for another request"):
        repeated(found, "k-1", "other")
    assert _job(store).id != first.id and _job(store, idempotency_key="k-2", request_hash="h").id != first.id
    assert store.count_jobs() == 3 and store.job_with_key(idempotency_key="nope") is None


def test_jobs_are_listed_newest_first_and_counted(store: Any) -> None:
    a, b = _job(store), _job(store, shapes=2)
    assert [j.id for j in store.list_jobs()] == [b.id, a.id]
    assert [len(j.tasks) for j in store.list_jobs()] == [2, 1]
    assert store.count_jobs() == 2 and store.count_jobs(state="queued") == 2 and store.count_jobs(state="done") == 0
    assert store.get_job(job_id=a.id) == a and store.get_job(job_id=a.id + 1000) is None


def test_a_worker_claims_only_what_its_device_and_backends_serve(store: Any) -> None:
    worker = _worker(store)
    other_device = _job(store, device_kind="cuda")
    other_backend = _job(store, backend="tilelang")
    named = _job(store, device_name="Other CPU")
    assert store.claim_task(worker_id=worker, device_kind="cpu", device_name="CPU", backends=["triton"]) is None
    low, high = _job(store), _job(store, priority=5)
    claim = store.claim_task(worker_id=worker, device_kind="cpu", device_name="CPU", backends=["triton"])
    assert claim is not None and claim.job.id == high.id and claim.task.state == "running"
    assert claim.job.state == "running" and claim.job.workers == (worker,)
    assert store.list_workers()[0].current_task_id == claim.task.id
    assert {other_device.id, other_backend.id, named.id, low.id} == {j.id for j in store.list_jobs(state="queued")}


def test_slots_bound_the_trials_and_a_measurement_spends_its_slot(store: Any) -> None:
    worker = _worker(store)
    job = _job(store, trials=2)
    claim = store.claim_task(worker_id=worker, device_kind="cpu", device_name="CPU", backends=["triton"])
    task_id = claim.task.id
    study = _study(store)
    store.attach_study(task_id=task_id, study_id=study.id)
    s1, s2 = (store.reserve_slot(task_id=task_id, worker_id=worker) for _ in range(2))
    assert s1 is not None and s2 is not None and store.reserve_slot(task_id=task_id, worker_id=worker) is None
    store.release_slot(slot_id=s2)
    store.release_slot(slot_id=s2)  # idempotent
    assert store.get_task(task_id=task_id).trials_reserved == 1
    with pytest.raises(ValueError):  # a slot is spent on a trial's measurement
        store.record_measurement(_m(study.id), slot_id=s1)
    m = store.record_measurement(_m(study.id, trial_number=0, median_us=3.0), slot_id=s1)
    task = store.get_task(task_id=task_id)
    assert (task.trials_done, task.trials_failed, task.best_us, task.study_id) == (1, 0, 3.0, study.id)
    assert task.best_config_json == m.config_json
    with pytest.raises(RecordConflictError):  # spent already: nothing more is stored
        store.record_measurement(_m(study.id, trial_number=1), slot_id=s1)
    # the same write again (its reply was lost at commit, the worker retries it): the stored measurement
    again = store.record_measurement(_m(study.id, trial_number=0, median_us=3.0), slot_id=s1)
    assert again.id == m.id and store.get_task(task_id=task_id).trials_done == 1
    with pytest.raises(RecordConflictError):  # the same trial number of another study: not this write
        store.record_measurement(_m(_study(store, S=8192).id, trial_number=0), slot_id=s1)
    assert store.count_measurements(study_id=study.id) == 1
    assert store.job_state(job_id=job.id) == "running"


def test_a_lost_worker_gives_back_its_slots_and_stores_nothing_more(store: Any) -> None:
    worker = _worker(store, lease_s=0.0)
    _job(store, trials=1)
    claim = store.claim_task(worker_id=worker, device_kind="cpu", device_name="CPU", backends=["triton"])
    slot = store.reserve_slot(task_id=claim.task.id, worker_id=worker)
    study = _study(store)
    assert store.reap_lost_workers(now=claim.task.updated_at + timedelta(hours=1)) == [worker]
    assert store.get_task(task_id=claim.task.id).trials_reserved == 0
    assert store.heartbeat(worker_id=worker, lease_s=30.0) is False
    with pytest.raises(SlotLostError):  # a RecordConflictError: the slot is gone, not spent
        store.record_measurement(_m(study.id, trial_number=0), slot_id=slot)
    assert store.count_measurements(study_id=study.id) == 0
    assert store.list_workers() == [] and store.list_workers(include_stopped=True)[0].state == "lost"


def test_a_slot_id_given_back_is_never_reused(store: Any) -> None:
    """A worker reaped while cut off still holds its old slot id: it must not spend another worker's slot."""
    lost, other = _worker(store, "lost", lease_s=0.0), _worker(store, "other")
    _job(store, trials=1)
    task_id = _claim(store, lost).task.id
    old_slot = store.reserve_slot(task_id=task_id, worker_id=lost)
    store.heartbeat(worker_id=other, lease_s=3600.0)
    assert store.reap_lost_workers(now=store.get_task(task_id=task_id).updated_at + timedelta(minutes=1)) == [lost]
    new_slot = store.reserve_slot(task_id=task_id, worker_id=other)
    assert new_slot is not None and new_slot != old_slot
    study = _study(store)
    with pytest.raises(SlotLostError):
        store.record_measurement(_m(study.id, trial_number=0), slot_id=old_slot)
    store.record_measurement(_m(study.id, trial_number=1), slot_id=new_slot)
    assert store.get_task(task_id=task_id).trials_done == 1


def test_a_stopping_worker_gives_back_its_slots(store: Any) -> None:
    worker = _worker(store)
    _job(store, trials=1)
    claim = store.claim_task(worker_id=worker, device_kind="cpu", device_name="CPU", backends=["triton"])
    store.reserve_slot(task_id=claim.task.id, worker_id=worker)
    assert store.heartbeat(worker_id=worker, lease_s=30.0) is True
    store.stop_worker(worker_id=worker)
    assert store.get_task(task_id=claim.task.id).trials_reserved == 0
    assert store.list_workers(include_stopped=True)[0].state == "stopped"


def test_one_worker_finalises_and_the_last_task_closes_the_job(store: Any) -> None:
    a, b = _worker(store, "a"), _worker(store, "b")
    job = _job(store, trials=1, shapes=2)
    claim = store.claim_task(worker_id=a, device_kind="cpu", device_name="CPU", backends=["triton"])
    study = _study(store)
    slot = store.reserve_slot(task_id=claim.task.id, worker_id=a)
    assert store.begin_finalize(task_id=claim.task.id, worker_id=a) is False  # a trial is still running
    store.record_measurement(_m(study.id, trial_number=0), slot_id=slot)
    assert store.begin_finalize(task_id=claim.task.id, worker_id=a) is True
    assert store.begin_finalize(task_id=claim.task.id, worker_id=b) is False
    with pytest.raises(RecordConflictError):
        store.finish_task(task_id=claim.task.id, worker_id=b, best_us=1.0, best_config_json="{}")
    done = store.finish_task(task_id=claim.task.id, worker_id=a, best_us=1.0, best_config_json='{"x":1}')
    assert done.state == "running" and [t.state for t in done.tasks] == ["done", "queued"]
    store.release_task(worker_id=a)
    second = store.claim_task(worker_id=b, device_kind="cpu", device_name="CPU", backends=["triton"])
    assert second.task.id == done.tasks[1].id
    store.fail_task(task_id=second.task.id, error="template gone")
    finished = store.get_job(job_id=job.id)
    assert finished.state == "failed" and "template gone" in (finished.error or "")
    assert finished.finished_at is not None


def test_a_finish_repeated_by_its_worker_changes_nothing_and_another_is_refused(store: Any) -> None:
    """A worker's finish whose answer was lost is sent again (the worker's retries): the job as it is, not
    a RecordConflictError logged as an interrupted task. Another worker's finish stays refused."""
    job = _job(store, trials=1)
    (task,) = job.tasks
    _worker(store, "w1")
    assert _claim(store, "w1") is not None and store.end_search(task_id=task.id)
    assert store.begin_finalize(task_id=task.id, worker_id="w1")
    done = store.finish_task(task_id=task.id, worker_id="w1", best_us=4.0, best_config_json='{"BLOCK_H": 4}')
    again = store.finish_task(task_id=task.id, worker_id="w1", best_us=9.0, best_config_json='{"BLOCK_H": 8}')
    assert done.state == again.state == "done" and again.tasks[0].best_us == 4.0
    with pytest.raises(RecordConflictError):
        store.finish_task(task_id=task.id, worker_id="w2", best_us=None, best_config_json=None)


def test_a_finish_after_the_task_was_failed_is_refused_not_taken_for_a_repeat(store: Any) -> None:
    """A task failed (by another worker's failure path) while a worker finalised it: that worker's finish
    returned as if it were a repeat of its own, and its result (a verification id, a best) was dropped
    silently. It is refused, as the contract says, and the failure stays."""
    job = _job(store, trials=1)
    (task,) = job.tasks
    _worker(store, "w1")
    assert _claim(store, "w1") is not None and store.end_search(task_id=task.id)
    assert store.begin_finalize(task_id=task.id, worker_id="w1")
    store.fail_task(task_id=task.id, error="w2: template no longer loads")
    with pytest.raises(RecordConflictError):
        store.finish_task(task_id=task.id, worker_id="w1", best_us=4.0, best_config_json='{"BLOCK_H": 4}')
    failed = store.get_job(job_id=job.id)
    assert failed.state == "failed" and failed.tasks[0].best_us is None
    assert "template no longer loads" in (failed.tasks[0].error or "")


def test_a_trial_measured_after_its_job_was_cancelled_is_counted(store: Any) -> None:
    """The trial running when a job is cancelled finishes and is stored; the task's trial count left it out,
    so the job said 0 of 2 where its study held one measured trial."""
    job = _job(store, trials=2)
    (task,) = job.tasks
    worker = _worker(store, "w1")
    assert _claim(store, worker) is not None
    study = _study(store)
    slot = store.reserve_slot(task_id=task.id, worker_id=worker)
    store.cancel_job(job_id=job.id)
    store.record_measurement(_m(study.id, trial_number=0), slot_id=slot)
    (after,) = store.get_job(job_id=job.id).tasks
    assert after.state == "cancelled" and after.trials_done == 1 and after.best_us == 5.0


def test_cancelling_stops_a_job_once(store: Any) -> None:
    job = _job(store, shapes=2)
    cancelled = store.cancel_job(job_id=job.id)
    assert cancelled.state == "cancelled" and {t.state for t in cancelled.tasks} == {"cancelled"}
    with pytest.raises(RecordConflictError):
        store.cancel_job(job_id=job.id)
    with pytest.raises(NotFoundError):
        store.cancel_job(job_id=job.id + 1000)
    worker = _worker(store)
    assert store.claim_task(worker_id=worker, device_kind="cpu", device_name="CPU", backends=["triton"]) is None


# -- verifications and verify jobs (``tuner verify``) ---------------------------------------------------------
def _verification(store: Any, study_id: int, median_us: float, **fields: Any) -> Any:
    base: dict[str, Any] = {
        "study_id": study_id, "config_json": '{"BLOCK_H": 4}', "stored_us": 5.0, "median_us": median_us,
        "low_us": median_us, "high_us": median_us, "drift": median_us / 5.0 - 1, "tolerance": 0.03,
        "flagged": abs(median_us / 5.0 - 1) > 0.03, "processes": 2,
        "figures": [{"process": 1, "candidates": []}, {"process": 2, "candidates": []}],
        "device_kind": "cpu", "device_name": "CPU", "fingerprint_hash": "f", "fingerprint_json": "{}",
    }
    return store.add_verification(**{**base, **fields})


def test_verifications_are_kept_and_the_latest_is_answered(store: Any) -> None:
    study, other = _study(store), _study(store, n=2)
    first = _verification(store, study.id, 5.1)
    second = _verification(store, study.id, 6.0)
    assert not first.flagged and second.flagged and second.drift == pytest.approx(0.2)
    assert [p["process"] for p in second.figures] == [1, 2] and second.config == {"BLOCK_H": 4}
    assert store.latest_verifications(study_ids=[study.id, other.id]) == {study.id: second}
    assert store.list_verifications(study_id=study.id) == [second, first]
    assert store.list_verifications(template="other") == []
    with pytest.raises(NotFoundError):
        _verification(store, 999_999, 5.0)
    with pytest.raises(ValueError):
        _verification(store, study.id, 5.0, processes=0)


def test_disproved_configs_are_wrong_final_rows_and_wrong_verifications_on_the_studys_device(store: Any) -> None:
    """What ``disproved_in`` reads, for many studies in one read: a final round's WRONG_RESULT (not a
    comparator's, not a trial's, not another failure) and a verification whose verified config was wrong in
    some process on the study's own device name (not on another device, not one with only right processes)."""
    study, other, clean = _study(store), _study(store, S=8192), _study(store, S=16384)

    def final(config: dict[str, Any], status: Status = Status.WRONG_RESULT, **fields: Any) -> None:
        store.record_measurement(_m(study.id, role="final", round_id=fields.pop("round_id", "r1"),
                                    config_json=config, status=status, median_us=None, **fields))

    def verification(study_id: int, config: str, *, wrong: bool = True, **fields: Any) -> None:
        label = {"label": VERIFIED_LABEL, "status": (Status.WRONG_RESULT if wrong else Status.OK).value}
        comparator = {"label": "comparator:torch", "status": Status.WRONG_RESULT.value}
        _verification(store, study_id, 5.0, config_json=config,
                      figures=[{"process": 1, "candidates": [label, comparator]},
                               {"process": 2, "candidates": [{**label, "status": Status.OK.value}]}], **fields)

    final({"BLOCK_H": 8})
    final({"BLOCK_H": 8}, round_id="r2")  # wrong again in a later round: one entry
    final({"BLOCK_H": 99}, candidate="comparator:torch")  # a comparator is no config of the template
    final({"BLOCK_H": 32}, Status.RUNTIME_ERROR)  # a crash may be the host's
    final({"BLOCK_H": 4}, Status.OK)
    store.record_measurement(_m(study.id, config_json={"BLOCK_H": 16}, status=Status.WRONG_RESULT, median_us=None))
    verification(study.id, '{"BLOCK_H": 2}', device_name=study.device_name)
    verification(study.id, '{"BLOCK_H": 64}', device_name="NVIDIA A100")  # another GPU's numerics
    verification(study.id, '{"BLOCK_H": 128}', wrong=False, device_name=study.device_name)  # wrong_processes 0
    verification(other.id, '{"BLOCK_H": 8}', device_name=other.device_name)
    verification(clean.id, '{"BLOCK_H": 8}', wrong=False, device_name=clean.device_name)
    got, selects = select_statements(
        store, lambda: store.disproved_configs(study_ids=[study.id, other.id, clean.id, 999_999]))
    assert got == {study.id: frozenset({'{"BLOCK_H":8}', '{"BLOCK_H":2}'}), other.id: frozenset({'{"BLOCK_H":8}'})}
    assert selects is None or len(selects) <= 2, selects  # however many studies
    assert store.disproved_configs(study_ids=[other.id]) == {other.id: frozenset({'{"BLOCK_H":8}'})}
    assert store.disproved_configs(study_ids=[clean.id]) == {}
    assert store.disproved_configs(study_ids=[]) == {}


def _disproved(store: Any, study: StudyRecord, *, wrong: bool = True, **fields: Any) -> dict[str, Any]:
    """``record_disproval``'s verification fields: a verification of {"BLOCK_H": 4} on the study's device
    name, wrong in its first process (right in both with ``wrong=False``)."""
    status = (Status.WRONG_RESULT if wrong else Status.OK).value
    figures = [{"process": 1, "candidates": [{"label": VERIFIED_LABEL, "status": status}]},
               {"process": 2, "candidates": [{"label": VERIFIED_LABEL, "status": Status.OK.value}]}]
    return {"study_id": study.id, "config_json": '{"BLOCK_H": 4}', "stored_us": 5.0, "median_us": 5.0,
            "low_us": 5.0, "high_us": 5.0, "drift": 0.0, "tolerance": 0.03, "flagged": wrong, "processes": 2,
            "figures": figures, "device_kind": "cuda", "device_name": study.device_name, "fingerprint_hash": "f",
            "fingerprint_json": "{}", **fields}


def _round(store: Any, study: StudyRecord) -> tuple[Any, Any, Any]:
    """A final round of {"BLOCK_H": 4} (5 µs, published, a week ago) and {"BLOCK_H": 8} (6 µs): (the best,
    both measurements)."""
    a = store.record_measurement(_m(study.id, role="final", round_id="r1", config_json={"BLOCK_H": 4}))
    b = store.record_measurement(_m(study.id, role="final", round_id="r1", config_json={"BLOCK_H": 8},
                                    median_us=6.0))
    best = store.publish_best(study_id=study.id, measurement_id=a.id,
                              published_at=a.created_at - timedelta(days=7))
    return best, a, b


def test_a_disproval_publishes_its_stand_in_at_the_disproved_bests_time_with_the_verification(store: Any) -> None:
    study = _study(store)
    best, a, b = _round(store, study)
    done = store.record_disproval(best_measurement_id=a.id, stand_in_id=b.id, **_disproved(store, study))
    assert done is not None and not done.withdrawn and done.verification.wrong_processes == 1
    assert done.replacement is not None and done.replacement.measurement_id == b.id
    assert done.replacement.published_at == best.published_at and done.replacement.median_us == 6.0
    assert store.get_study_best(study_id=study.id) == done.replacement
    assert store.list_verifications(study_id=study.id) == [done.verification]
    assert store.disproved_configs(study_ids=[study.id]) == {study.id: frozenset({'{"BLOCK_H":4}'})}


def test_a_disproval_without_a_stand_in_withdraws_the_best(store: Any) -> None:
    study = _study(store)
    _, a, _ = _round(store, study)
    done = store.record_disproval(best_measurement_id=a.id, withdraw=True, **_disproved(store, study))
    assert done is not None and done.withdrawn and done.replacement is None
    assert store.get_study_best(study_id=study.id) is None
    assert store.list_verifications(study_id=study.id) == [done.verification]


def test_a_disproval_decided_on_a_best_since_replaced_stores_nothing(store: Any) -> None:
    """A final round published another best after the caller read it: nothing is stored, the verification
    neither (the caller reads again and decides again); decided on the best as it is, it is stored and a
    best not disproved is left as it is."""
    study = _study(store)
    _, a, b = _round(store, study)
    newer = store.publish_best(study_id=study.id, measurement_id=b.id)  # a final round, meanwhile
    assert store.record_disproval(best_measurement_id=a.id, stand_in_id=b.id, **_disproved(store, study)) is None
    assert store.record_disproval(best_measurement_id=a.id, withdraw=True, **_disproved(store, study)) is None
    assert store.record_disproval(best_measurement_id=None, **_disproved(store, study)) is None
    assert store.list_verifications(study_id=study.id) == []
    assert store.get_study_best(study_id=study.id) == newer
    done = store.record_disproval(best_measurement_id=b.id, **_disproved(store, study))
    assert done is not None and done.replacement is None and not done.withdrawn
    assert store.list_verifications(study_id=study.id) == [done.verification]
    assert store.get_study_best(study_id=study.id) == newer
    fresh = _study(store, S=8192)  # nothing published: nothing to act on, the verification is recorded
    assert store.record_disproval(best_measurement_id=None, **_disproved(store, fresh)) is not None


def test_a_disproval_whose_stand_in_a_final_round_found_wrong_since_stores_nothing(store: Any) -> None:
    """The caller decided on a stand-in that a later final round measured WRONG_RESULT (stored, not yet
    published): nothing is stored, the caller decides again (the stand-in would be served though wrong)."""
    study = _study(store)
    _, a, b = _round(store, study)
    store.record_measurement(_m(study.id, role="final", round_id="r2", config_json={"BLOCK_H": 8},
                                status=Status.WRONG_RESULT, median_us=None))
    assert store.record_disproval(best_measurement_id=a.id, stand_in_id=b.id, **_disproved(store, study)) is None
    assert store.list_verifications(study_id=study.id) == []
    assert store.get_study_best(study_id=study.id).measurement_id == a.id
    done = store.record_disproval(best_measurement_id=a.id, withdraw=True, **_disproved(store, study))
    assert done is not None and done.withdrawn


def test_a_final_round_publishes_only_a_config_not_disproved(store: Any) -> None:
    """publish_unless_disproved: publishes as publish_best; a config found wrong (a final round's
    WRONG_RESULT, a verification on the study's device name) is not published and the best stays."""
    study = _study(store)
    best, a, b = _round(store, study)
    store.record_measurement(_m(study.id, role="final", round_id="r2", config_json={"BLOCK_H": 8},
                                status=Status.WRONG_RESULT, median_us=None))
    assert store.publish_unless_disproved(study_id=study.id, measurement_id=b.id) is None
    assert store.get_study_best(study_id=study.id) == best
    store.add_verification(**_disproved(store, study))  # {"BLOCK_H": 4} wrong on the study's device
    assert store.publish_unless_disproved(study_id=study.id, measurement_id=a.id) is None
    c = store.record_measurement(_m(study.id, role="final", round_id="r2", config_json={"BLOCK_H": 2},
                                    median_us=7.0))
    published = store.publish_unless_disproved(study_id=study.id, measurement_id=c.id)
    assert published is not None and published == store.get_study_best(study_id=study.id)
    assert published.measurement_id == c.id and published.median_us == 7.0
    with pytest.raises(NotFoundError):
        store.publish_unless_disproved(study_id=study.id, measurement_id=999_999)


def test_a_publish_replacing_a_best_that_changed_meanwhile_changes_nothing(store: Any) -> None:
    """publish_unless_disproved(replacing=…): publishes only while the study's best is that measurement's
    (`tuner rejudge --apply` must not overwrite a round or a stand-in published since it read), keeping the
    time it is given."""
    study = _study(store)
    best, a, b = _round(store, study)
    at = best.published_at
    assert best.measurement_id == a.id
    assert store.publish_unless_disproved(study_id=study.id, measurement_id=b.id, replacing=b.id) is None
    assert store.get_study_best(study_id=study.id) == best
    moved = store.publish_unless_disproved(study_id=study.id, measurement_id=b.id, replacing=a.id,
                                           published_at=at)
    assert moved is not None and moved.measurement_id == b.id and moved.published_at == at
    store.withdraw_best(study_id=study.id)
    assert store.publish_unless_disproved(study_id=study.id, measurement_id=a.id, replacing=b.id) is None
    assert store.get_study_best(study_id=study.id) is None
    with pytest.raises(NotFoundError):  # an unknown study is an error on every store, not a refusal
        store.publish_unless_disproved(study_id=999_999, measurement_id=a.id, replacing=a.id)


def test_a_publish_holding_a_final_round_needs_the_round_still_held(store: Any) -> None:
    """With ``holding``, a publish goes through only while that worker finalises that task: a worker declared
    lost, whose round another worker took and published, is refused (SlotLostError) and the best stays."""
    from tuner.store import RoundHold

    study = _study(store)
    ours = store.record_measurement(_m(study.id, role="final", round_id="a"))
    theirs = store.record_measurement(_m(study.id, role="final", round_id="b", config_json={"BLOCK_H": 8}))
    job = _job(store, trials=1)
    (task,) = job.tasks
    with pytest.raises(SlotLostError):  # nobody finalises it yet
        store.publish_unless_disproved(study_id=study.id, measurement_id=ours.id, holding=RoundHold(task.id, "a"))
    _worker(store, "a", lease_s=0.01)
    assert _claim(store, "a") is not None and store.end_search(task_id=task.id)
    assert store.begin_finalize(task_id=task.id, worker_id="a")
    assert store.publish_unless_disproved(study_id=study.id, measurement_id=ours.id,
                                          holding=RoundHold(task.id, "a")).measurement_id == ours.id
    lease = store.list_workers()[0].lease_expires_at
    assert store.reap_lost_workers(now=lease + timedelta(seconds=1)) == ["a"]
    _worker(store, "b")
    assert _claim(store, "b") is not None and store.begin_finalize(task_id=task.id, worker_id="b")
    assert store.publish_unless_disproved(study_id=study.id, measurement_id=theirs.id,
                                          holding=RoundHold(task.id, "b")).measurement_id == theirs.id
    with pytest.raises(SlotLostError):
        store.publish_unless_disproved(study_id=study.id, measurement_id=ours.id, holding=RoundHold(task.id, "a"))
    assert store.get_study_best(study_id=study.id).measurement_id == theirs.id


def test_a_disproval_the_store_refuses_stores_nothing(store: Any) -> None:
    """One transaction: a stand-in that is unknown, of another study or not publishable, a stand-in or a
    withdrawal asked of a verification on another device name or without a wrong process, both at once, or
    either without the best they replace: the verification is not stored either, the best stays."""
    study, other = _study(store), _study(store, S=8192)
    best, a, _ = _round(store, study)
    foreign = store.record_measurement(_m(other.id, role="final", round_id="r9"))
    wrong = store.record_measurement(_m(study.id, role="final", round_id="r1", config_json={"BLOCK_H": 16},
                                        status=Status.WRONG_RESULT, median_us=None))
    refused: list[tuple[type[Exception], dict[str, Any]]] = [
        (NotFoundError, {"stand_in_id": a.id + 1000}),
        (RecordConflictError, {"stand_in_id": foreign.id}),
        (RecordConflictError, {"stand_in_id": wrong.id}),
        (RecordConflictError, {"withdraw": True, "device_name": "NVIDIA A100"}),  # another GPU's numerics
        (ValueError, {"withdraw": True, "wrong": False}),
        (ValueError, {"withdraw": True, "stand_in_id": wrong.id}),
        (ValueError, {"withdraw": True, "best_measurement_id": None}),
        (ValueError, {"processes": 0}),
        (NotFoundError, {"study_id": 999_999}),
    ]
    for error, fields in refused:
        args = {"best_measurement_id": a.id, "stand_in_id": None, "withdraw": False, **fields}
        verification = _disproved(store, study, wrong=args.pop("wrong", True),
                                  **{k: args.pop(k) for k in ("device_name", "processes", "study_id") if k in args})
        with pytest.raises(error):
            store.record_disproval(**args, **verification)
        assert store.get_study_best(study_id=study.id) == best, fields
        assert store.list_verifications() == [], fields
    # on another device name it only records (the caller asks nothing of the best)
    done = store.record_disproval(best_measurement_id=a.id, **_disproved(store, study, device_name="NVIDIA A100"))
    assert done is not None and done.replacement is None and store.get_study_best(study_id=study.id) == best
    assert store.disproved_configs(study_ids=[study.id]) == {study.id: frozenset({'{"BLOCK_H":16}'})}


def test_a_verify_job_has_no_trials_and_one_worker_takes_each_task(store: Any) -> None:
    a, b = _worker(store, "a"), _worker(store, "b")
    job = store.create_verify_job(template="t", template_version="1", backend="triton", device_kind="cpu",
                                  device_name=None, tasks=[("w0", "n=0", '{"n": 0}')], processes=3)
    assert job.kind == "verify" and job.processes == 3 and job.tasks[0].trials_target == 0
    claim = store.claim_task(worker_id=a, device_kind="cpu", device_name="CPU", backends=["triton"])
    assert claim is not None and claim.job.kind == "verify"
    assert store.begin_finalize(task_id=claim.task.id, worker_id=a) is True
    assert store.claim_task(worker_id=b, device_kind="cpu", device_name="CPU", backends=["triton"]) is None
    done = store.finish_task(task_id=claim.task.id, worker_id=a, best_us=5.0, best_config_json='{"x":1}')
    assert done.state == "done"
    for bad in ({"kind": "verify", "trials": 0}, {"kind": "verify", "trials": 1, "processes": 2},
                {"kind": "tune", "trials": 0}, {"kind": "other"}):
        with pytest.raises(ValueError):
            _job(store, **bad)


def test_a_verify_task_keeps_the_verification_it_recorded(store: Any) -> None:
    """``finish_task(verification_id=…)``: the task keeps the verification (done or failed) and its study, and
    ``verifications_by_task`` reads it back for many tasks at once (tune tasks and unknown ids left out); an
    unknown verification is refused and the task stays as it was."""
    study, other = _study(store), _study(store, S=8192)
    mine = _verification(store, study.id, 5.0, device_name="another CPU")
    theirs = _verification(store, other.id, 5.0)
    worker = _worker(store)
    job = store.create_verify_job(template="t", template_version="1", backend="triton", device_kind="cpu",
                                  device_name=None, tasks=[(f"w{i}", f"n={i}", f'{{"n": {i}}}') for i in range(3)],
                                  processes=2)
    tasks = []
    for _ in range(3):
        claim = _claim(store, worker)
        assert claim is not None and store.begin_finalize(task_id=claim.task.id, worker_id=worker)
        tasks.append(claim.task.id)
        if len(tasks) == 1:
            with pytest.raises(NotFoundError):
                store.finish_task(task_id=tasks[0], worker_id=worker, best_us=None, best_config_json=None,
                                  verification_id=theirs.id + 1000)
            assert store.get_task(task_id=tasks[0]).state == "finalizing"
        check = {0: mine, 1: theirs}.get(len(tasks) - 1)
        store.finish_task(task_id=claim.task.id, worker_id=worker, best_us=None, best_config_json=None,
                          error="found wrong" if check is theirs else None,
                          verification_id=None if check is None else check.id)
    done = store.get_job(job_id=job.id)
    assert [(t.state, t.verification_id, t.study_id) for t in done.tasks] == [
        ("done", mine.id, study.id), ("failed", theirs.id, other.id), ("done", None, None)]
    tune = _job(store)
    assert store.verifications_by_task(task_ids=[*tasks, tune.tasks[0].id, 999_999]) == {
        tasks[0]: mine, tasks[1]: theirs}
    assert store.verifications_by_task(task_ids=[]) == {}


def test_a_verify_job_keeps_its_comparator_processes(store: Any) -> None:
    """``comparator_processes`` is stored with the job and comes back with it (claimed, listed); None (the
    default) means every process; outside 1..processes, or on a tuning job, it is refused and nothing is stored."""
    verify = {"template": "t", "template_version": "1", "backend": "triton", "device_kind": "cpu",
              "device_name": None, "tasks": [("w0", "n=0", '{"n": 0}')], "processes": 3}
    job = store.create_verify_job(**verify, comparator_processes=2)
    assert job.comparator_processes == 2 and store.get_job(job_id=job.id).comparator_processes == 2
    assert store.create_verify_job(**verify, priority=-1).comparator_processes is None
    claim = _claim(store, _worker(store, "a"))
    assert claim is not None and claim.job.id == job.id and claim.job.comparator_processes == 2
    assert [j.comparator_processes for j in store.list_jobs()] == [None, 2]
    for bad in (0, 4, -1):
        with pytest.raises(ValueError, match="comparator_processes must be between 1 and processes"):
            store.create_verify_job(**verify, comparator_processes=bad)
    with pytest.raises(ValueError, match="verify jobs only"):
        _job(store, comparator_processes=1)
    assert store.count_jobs() == 2


# -- mixed fleets: advertised templates, local failures ----------------------------------------------------
def test_a_worker_claims_only_the_templates_and_versions_it_advertised(store: Any) -> None:
    newer, other, wanted = _job(store, template_version="2"), _job(store, template="u"), _job(store)
    assert _claim(store, _worker(store, "none", templates={})) is None
    old = _worker(store, "old", templates={"t": "1", "v": "3"})
    assert store.list_workers()[0].templates == {"t": "1", "v": "3"}
    claim = _claim(store, old)
    assert claim is not None and claim.job.id == wanted.id
    store.release_task(worker_id=old)
    any_template = _worker(store, "any")  # advertised nothing: any template (workers of an older tuner)
    assert store.list_workers()[0].templates is None
    assert _claim(store, any_template).job.id == newer.id
    assert _claim(store, _worker(store, "u", templates={"u": "1"})).job.id == other.id


def _claims_as_the_rule_says(store: Any, job_id: int, worker_id: str) -> Any:
    """What ``records.claimable_tasks`` names for the worker on the job (the only active one), checked against
    what ``claim_task`` takes: the first of them, or nothing. The claim, or None."""
    job = store.get_job(job_id=job_id)
    (worker,) = [w for w in store.list_workers() if w.id == worker_id]
    attempts = [a for t in job.tasks for a in store.list_attempts(task_id=t.id)]
    named = claimable_tasks(job, job.tasks, worker, attempts)
    claim = _claim(store, worker_id)
    assert (claim and claim.task.id) == (named[0].id if named else None), (named, claim)
    return claim


def test_claim_task_takes_what_claimable_tasks_names(store: Any) -> None:
    """One claim rule (records.claimable_tasks: the memory store runs it, the SQL store states it as a query):
    a shape given up bars only that shape; a cancelled job, or one whose one trial another worker holds,
    offers nothing."""
    two = _job(store, shapes=2, trials=2)
    first, second = two.tasks
    _worker(store, "w")
    assert _claims_as_the_rule_says(store, two.id, "w").task.id == first.id
    store.fail_attempt(task_id=first.id, worker_id="w", reason="DeviceError: gone")
    assert _claims_as_the_rule_says(store, two.id, "w").task.id == second.id
    store.release_task(worker_id="w")
    store.cancel_job(job_id=two.id)
    assert _claims_as_the_rule_says(store, two.id, "w") is None
    one = _job(store, trials=1)
    holder = _worker(store, "x")
    claim = _claims_as_the_rule_says(store, one.id, holder)
    assert store.reserve_slot(task_id=claim.task.id, worker_id=holder) is not None
    assert _claims_as_the_rule_says(store, one.id, "w") is None
    store.release_task(worker_id=holder)
    assert _claims_as_the_rule_says(store, one.id, "w").task.id == claim.task.id


def test_the_claim_rule_holds_for_device_names_versions_backends_and_verify_tasks(store: Any) -> None:
    """The same rule on what a job asks of a worker: its device name (None: any), the template version the
    worker advertises, the backend; and a verify task (no trials) until one worker begins its final round."""
    _worker(store, "w", templates={"t": "1"})
    elsewhere = _job(store, device_name="GPU-X")  # another device name: not this worker's
    assert _claims_as_the_rule_says(store, elsewhere.id, "w") is None
    store.cancel_job(job_id=elsewhere.id)
    newer = _job(store, template_version="2")  # a version the worker does not advertise
    assert _claims_as_the_rule_says(store, newer.id, "w") is None
    store.cancel_job(job_id=newer.id)
    tilelang = _job(store, backend="tilelang")  # a backend the worker does not run
    assert _claims_as_the_rule_says(store, tilelang.id, "w") is None
    store.cancel_job(job_id=tilelang.id)
    named = _job(store, device_name="CPU")  # its own device name
    assert _claims_as_the_rule_says(store, named.id, "w") is not None
    store.release_task(worker_id="w")
    store.cancel_job(job_id=named.id)
    check = store.create_verify_job(template="t", template_version="1", backend="triton", device_kind="cpu",
                                    device_name=None, tasks=[("n=0", "n=0", '{"n": 0}')], processes=2)
    claim = _claims_as_the_rule_says(store, check.id, "w")
    assert claim is not None and store.begin_finalize(task_id=claim.task.id, worker_id="w")
    _worker(store, "v")
    assert _claims_as_the_rule_says(store, check.id, "v") is None  # being finalised by w
    store.release_task(worker_id="w")  # w leaves it unfinished (a store error in its round): open again
    assert _claims_as_the_rule_says(store, check.id, "v") is not None


def test_a_task_given_up_by_k_distinct_workers_fails_with_every_reason(store: Any) -> None:
    job = _job(store, trials=3)
    (task_id,) = [t.id for t in job.tasks]
    reasons = {"w1": "ImportError: No module named 'tilelang'", "w2": "has t@0, the job wants t@1",
               "w3": "DeviceError: CUDA unavailable"}
    for n, (worker, reason) in enumerate(reasons.items(), start=1):
        _worker(store, worker)
        claim = _claim(store, worker)
        assert claim is not None and claim.task.id == task_id
        store.reserve_slot(task_id=task_id, worker_id=worker)
        task = store.fail_attempt(task_id=task_id, worker_id=worker, reason=reason)
        assert task.attempts == n and task.trials_reserved == 0
        assert store.list_workers()[0].state == "idle" and store.get_job(job_id=job.id).workers == ()
        if n < 3:
            assert task.state == "running" and task.error is None and store.job_state(job_id=job.id) == "running"
            again = store.fail_attempt(task_id=task_id, worker_id=worker, reason="again")
            assert again.attempts == n, "a worker's second attempt counts once"
            assert _claim(store, worker) is None, "a worker does not claim a task it gave up"
    failed = store.get_job(job_id=job.id)
    assert failed.state == "failed" and failed.tasks[0].state == "failed" and failed.finished_at is not None
    for worker, reason in reasons.items():
        assert f"{worker}: {reason}" in (failed.error or "") and f"{worker}: {reason}" in (failed.tasks[0].error or "")
    assert [(a.worker_id, a.reason) for a in store.list_attempts(task_id=task_id)] == list(reasons.items())
    assert _claim(store, _worker(store, "w4")) is None
    with pytest.raises(ValueError):
        _job(store, max_attempts=0)
    with pytest.raises(NotFoundError):
        store.fail_attempt(task_id=task_id + 1000, worker_id="w4", reason="x")


def test_a_job_fails_by_attempts_once_none_of_its_tasks_runs(store: Any) -> None:
    job = _job(store, trials=1, shapes=2, max_attempts=1)
    assert job.max_attempts == 1 and store.get_job(job_id=job.id).max_attempts == 1
    worker = _worker(store)
    first = _claim(store, worker).task.id
    assert store.fail_attempt(task_id=first, worker_id=worker, reason="gone").state == "failed"
    assert store.job_state(job_id=job.id) == "running"
    second = _claim(store, worker).task.id
    store.fail_attempt(task_id=second, worker_id=worker, reason="gone too")
    failed = store.get_job(job_id=job.id)
    assert failed.state == "failed" and failed.error == (
        "w0: could not run on 1 worker(s): w1: gone; w1: could not run on 1 worker(s): w1: gone too")


def test_the_attempts_of_many_tasks_are_read_at_once(store: Any) -> None:
    """attempts_by_task: each task's own attempts, oldest first, as list_attempts gives them; tasks without
    any and unknown ids left out; in SQL one read, however many tasks (a page of jobs read one per task)."""
    jobs = [_job(store, shapes=3) for _ in range(3)]
    tasks = [t.id for job in jobs for t in job.tasks]
    for worker in ("a", "b"):
        _worker(store, worker)
        for _ in tasks[:-1] if worker == "a" else tasks[:2]:  # the last task: no attempt
            task = _claim(store, worker).task
            store.fail_attempt(task_id=task.id, worker_id=worker, reason=f"{worker} gave {task.id} up")
    got, selects = select_statements(store, lambda: store.attempts_by_task(task_ids=[*tasks, 999_999]))
    assert selects is None or len(selects) == 1, selects
    assert got == {t: store.list_attempts(task_id=t) for t in tasks[:-1]}
    assert [[(a.worker_id, a.reason) for a in got[t]] for t in tasks[:3]] == [
        [("a", f"a gave {tasks[0]} up"), ("b", f"b gave {tasks[0]} up")],
        [("a", f"a gave {tasks[1]} up"), ("b", f"b gave {tasks[1]} up")], [("a", f"a gave {tasks[2]} up")]]
    assert store.attempts_by_task(task_ids=[tasks[-1]]) == {} and store.attempts_by_task(task_ids=[]) == {}
    # more ids than PostgreSQL binds in one statement (65 535): a listing of 500 large jobs asks that many
    many = [*range(10_000_000, 10_070_000), tasks[0]]
    assert store.attempts_by_task(task_ids=many) == {tasks[0]: got[tasks[0]]}


def _finalising(store: Any) -> tuple[Any, int, str, str]:
    """A one-trial job whose trial worker "a" measured and whose final round it began; "b" waits."""
    job = _job(store, trials=1)
    a, b = _worker(store, "a"), _worker(store, "b")
    task_id = _claim(store, a).task.id
    slot = store.reserve_slot(task_id=task_id, worker_id=a)
    store.record_measurement(_m(_study(store).id, trial_number=0), slot_id=slot)
    assert store.begin_finalize(task_id=task_id, worker_id=a) is True
    return job, task_id, a, b


def test_a_search_out_of_configs_ends_at_what_was_done(store: Any) -> None:
    """end_search brings the target down to the slots reserved: no new slot, the trial in flight is still
    told, then the final round can be taken; a slot given back unmeasured lets it come down further."""
    _job(store, trials=5)
    a, b = _worker(store, "a"), _worker(store, "b")
    task_id = _claim(store, a).task.id
    spent = store.reserve_slot(task_id=task_id, worker_id=a)
    store.record_measurement(_m(_study(store).id, trial_number=0), slot_id=spent)
    assert _claim(store, b).task.id == task_id
    in_flight = store.reserve_slot(task_id=task_id, worker_id=b)
    assert store.end_search(task_id=task_id) is True  # b's trial still counts
    task = store.get_task(task_id=task_id)
    assert (task.trials_target, task.trials_done, task.trials_reserved) == (2, 1, 2)
    assert store.reserve_slot(task_id=task_id, worker_id=a) is None  # no new slot after the end
    assert store.end_search(task_id=task_id) is False  # nothing left to close
    assert store.begin_finalize(task_id=task_id, worker_id=a) is False  # b's trial is not told yet
    store.record_measurement(_m(_study(store).id, trial_number=1), slot_id=in_flight)
    assert store.begin_finalize(task_id=task_id, worker_id=a) is True
    assert store.end_search(task_id=task_id) is False  # not while finalizing


def test_a_slot_given_back_after_the_search_ended_lets_it_end_lower(store: Any) -> None:
    _job(store, trials=5)
    a, b = _worker(store, "a"), _worker(store, "b")
    task_id = _claim(store, a).task.id
    assert _claim(store, b).task.id == task_id
    skipped = store.reserve_slot(task_id=task_id, worker_id=b)  # b asks a config it will not measure
    assert store.end_search(task_id=task_id) is True
    store.release_slot(slot_id=skipped)
    assert store.begin_finalize(task_id=task_id, worker_id=a) is False  # target 1, nothing done
    assert store.end_search(task_id=task_id) is True
    task = store.get_task(task_id=task_id)
    assert (task.trials_target, task.trials_done, task.trials_reserved) == (0, 0, 0)
    assert store.begin_finalize(task_id=task_id, worker_id=a) is True


def test_a_final_round_given_up_goes_back_to_the_others(store: Any) -> None:
    job, task_id, a, b = _finalising(store)
    task = store.fail_attempt(task_id=task_id, worker_id=a, reason="DeviceError: lost")
    assert (task.state, task.finalizer_id, task.attempts, task.trials_done) == ("running", None, 1, 1)
    assert _claim(store, b).task.id == task_id and store.begin_finalize(task_id=task_id, worker_id=b) is True
    done = store.finish_task(task_id=task_id, worker_id=b, best_us=1.0, best_config_json="{}")
    assert done.id == job.id and done.state == "done"
    assert store.fail_attempt(task_id=task_id, worker_id=b, reason="late").state == "done"


def test_a_final_round_left_by_a_live_worker_goes_back_to_the_others(store: Any) -> None:
    """A worker that leaves its task during the final round (a store error in the round: it releases the task
    and lives on) does not keep it 'finalizing': any worker, itself included, may take the round again."""
    job, task_id, a, b = _finalising(store)
    store.release_task(worker_id=a)
    task = store.get_task(task_id=task_id)
    assert (task.state, task.finalizer_id, task.attempts, task.trials_done) == ("running", None, 0, 1)
    assert _claim(store, b).task.id == task_id and store.begin_finalize(task_id=task_id, worker_id=b) is True
    assert store.finish_task(task_id=task_id, worker_id=b, best_us=1.0, best_config_json="{}").state == "done"
    assert store.get_job(job_id=job.id).state == "done"



def test_workers_giving_a_task_up_do_not_fail_it_while_a_capable_worker_runs_it(store: Any) -> None:
    """K workers giving a task up fail it only once no live worker is on it: the capable worker keeps
    reserving its trials; the task fails when that worker leaves (stopped or reaped) and none is left."""
    job = _job(store, trials=3, max_attempts=2)
    capable, x, y = _worker(store, "capable"), _worker(store, "x"), _worker(store, "y")
    task_id = _claim(store, capable).task.id
    assert store.reserve_slot(task_id=task_id, worker_id=capable) is not None
    for worker in (x, y):
        assert _claim(store, worker).task.id == task_id
        assert store.fail_attempt(task_id=task_id, worker_id=worker, reason="DeviceError: gone").state == "running"
    assert store.get_task(task_id=task_id).attempts == 2 and store.job_state(job_id=job.id) == "running"
    assert store.reserve_slot(task_id=task_id, worker_id=capable) is not None
    store.stop_worker(worker_id=capable)
    failed = store.get_job(job_id=job.id)
    assert failed.state == "failed" and failed.tasks[0].trials_reserved == 0, failed
    assert "could not run on 2 worker(s)" in (failed.error or "")


def test_a_live_capable_worker_that_has_not_tried_a_task_keeps_it_open(store: Any) -> None:
    job = _job(store, trials=2, max_attempts=1)
    first, untried = _worker(store, "first"), _worker(store, "untried", lease_s=0.5)
    _worker(store, "other", templates={"u": "1"})  # does not serve the job: not counted
    task_id = _claim(store, first).task.id
    assert store.fail_attempt(task_id=task_id, worker_id=first, reason="DeviceError: gone").state == "running"
    assert _claim(store, untried).task.id == task_id
    store.release_task(worker_id=untried)
    store.reap_lost_workers(now=store.list_workers()[0].lease_expires_at + timedelta(seconds=60))
    assert store.get_job(job_id=job.id).state == "failed"


def test_a_worker_that_cannot_load_a_template_withdraws_it_without_charging_the_task(store: Any) -> None:
    job = _job(store, trials=2, max_attempts=1)
    broken = _worker(store, "broken", templates={"t": "1", "u": "1"})
    task_id = _claim(store, broken).task.id
    store.reserve_slot(task_id=task_id, worker_id=broken)
    store.withdraw_template(worker_id=broken, template="t", version="1")
    (worker,) = store.list_workers()
    assert worker.templates == {"u": "1"} and worker.state == "idle" and worker.current_task_id is None
    task = store.get_task(task_id=task_id)
    assert (task.state, task.attempts, task.trials_reserved, task.error) == ("running", 0, 0, None)
    assert store.list_attempts(task_id=task_id) == [] and _claim(store, broken) is None
    assert store.job_state(job_id=job.id) == "running"


def test_a_measurement_on_a_failed_task_leaves_its_counts(store: Any) -> None:
    _job(store, trials=3)
    worker = _worker(store)
    task_id = _claim(store, worker).task.id
    slot = store.reserve_slot(task_id=task_id, worker_id=worker)
    store.fail_task(task_id=task_id, error="gone")
    store.record_measurement(_m(_study(store).id, trial_number=0), slot_id=slot)
    task = store.get_task(task_id=task_id)
    assert (task.state, task.trials_done, task.best_us) == ("failed", 0, None)


def test_slots_a_lost_worker_reserved_before_rejoining_go_back_at_the_next_reap(store: Any) -> None:
    """A worker declared lost, alive but cut off, may reserve a slot before it learns it; killed then, it
    never rejoins: the next reap gives the slot back (the task could never finish otherwise)."""
    _job(store, trials=2)
    w = _worker(store, "w", lease_s=0.01)
    task_id = _claim(store, w).task.id
    later = store.list_workers()[0].lease_expires_at + timedelta(seconds=1)
    assert store.reap_lost_workers(now=later) == [w]
    assert store.reserve_slot(task_id=task_id, worker_id=w) is not None  # before it knows
    assert store.get_task(task_id=task_id).trials_reserved == 1
    assert store.reap_lost_workers(now=later + timedelta(seconds=1)) == []  # it was lost already
    assert store.get_task(task_id=task_id).trials_reserved == 0


def test_a_lost_worker_rejoins_and_an_unknown_one_is_told_to_register(store: Any) -> None:
    w = _worker(store, "w", lease_s=0.01)
    assert store.reap_lost_workers(now=store.list_workers()[0].lease_expires_at + timedelta(seconds=1)) == [w]
    assert store.rejoin_worker(worker_id=w, lease_s=30.0) is True
    (back,) = store.list_workers()
    assert back.id == w and back.state == "idle"
    assert store.rejoin_worker(worker_id="never-registered", lease_s=30.0) is False
    assert [x.id for x in store.list_workers(include_stopped=True)] == [w]


def test_registering_again_is_idempotent_for_its_process_and_refused_to_another(store: Any) -> None:
    """A registration retried because its commit's answer was lost finds its own row: registered afresh (it
    killed the worker at start-up, as a key conflict). The id of another host or process, or of a worker
    holding a task, stays refused."""
    w = _worker(store, "w", lease_s=0.01)
    again = store.register_worker(worker_id=w, host="h", pid=1, device_kind="cpu", device_name="CPU",
                                  device_index=0, backends=["triton"], fingerprint_hash="g", fingerprint_json="{}",
                                  lease_s=30.0)
    assert (again.state, again.fingerprint_hash) == ("idle", "g") and again.lease_expires_at > store.clock()
    assert [(x.id, x.fingerprint_hash) for x in store.list_workers()] == [(w, "g")]
    with pytest.raises(RecordConflictError):
        store.register_worker(worker_id=w, host="h", pid=2, device_kind="cpu", device_name="CPU", device_index=0,
                              backends=["triton"], fingerprint_hash="f", fingerprint_json="{}", lease_s=30.0)
    _job(store)
    assert _claim(store, w) is not None
    with pytest.raises(RecordConflictError):
        _worker(store, w)
    assert store.list_workers()[0].current_task_id is not None


def test_a_page_of_jobs_holds_each_jobs_tasks_and_workers(store: Any) -> None:
    """Listing jobs: every job with its own tasks, in order, and the busy workers on it; in SQL one read of
    the jobs, one of their tasks and one of the workers, however many jobs (it was two reads per job)."""
    jobs = [_job(store, shapes=1 + i % 3) for i in range(12)]
    w = _worker(store, "w")
    claimed = _claim(store, w).task
    listed, selects = select_statements(store, lambda: store.list_jobs(limit=50))
    assert [j.id for j in listed] == sorted((j.id for j in jobs), reverse=True)
    for job in listed:
        created = next(j for j in jobs if j.id == job.id)
        assert [t.id for t in job.tasks] == [t.id for t in created.tasks]
        assert [t.position for t in job.tasks] == list(range(len(job.tasks)))
        assert all(t.job_id == job.id for t in job.tasks)
        assert job.workers == (("w",) if job.id == claimed.job_id else ())
    assert selects is None or len(selects) <= 4, selects


def test_the_store_clock_is_utc_and_sets_the_leases(store: Any) -> None:
    before = store.clock()
    worker = _worker(store, lease_s=30.0)
    after = store.clock()
    assert before.utcoffset() == timedelta(0) and before <= after
    (w,) = store.list_workers()
    assert w.id == worker and before + timedelta(seconds=30) <= w.lease_expires_at <= after + timedelta(seconds=30)


@pytest.mark.postgres
def test_a_host_whose_clock_is_behind_keeps_its_lease_on_postgresql(postgres_sandbox: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hosts, one store: a worker registered and renewed by a host whose clock runs 10 minutes behind
    is live for a host with the right clock (its lease is the server's time plus the lease), and is reaped
    once that lease has passed on the server's clock."""
    from datetime import datetime, timezone

    import tuner.db.jobs as jobs_module
    import tuner.db.models as models
    from tuner import db

    store = db.Store.open(postgres_sandbox.new_url())
    try:
        def behind() -> datetime:
            return datetime.now(timezone.utc) - timedelta(minutes=10)

        with monkeypatch.context() as skewed:  # this host's clock, 10 minutes behind
            skewed.setattr(models, "utcnow", behind)
            skewed.setattr(jobs_module, "utcnow", behind, raising=False)
            worker = _worker(store, lease_s=30.0)
            assert store.heartbeat(worker_id=worker, lease_s=30.0)
        assert store.reap_lost_workers() == []  # another host, with the right clock
        (w,) = store.list_workers()
        assert w.lease_expires_at > store.clock() > datetime.now(timezone.utc) - timedelta(minutes=1)
        assert store.reap_lost_workers(now=store.clock() + timedelta(seconds=31)) == [worker]
    finally:
        store.close()


@pytest.mark.postgres
def test_a_best_published_from_a_host_whose_clock_is_behind_is_stamped_by_the_servers_clock(
        postgres_sandbox: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lookup serves a shape's most recently published best: a best published from a host whose clock
    ran 10 minutes behind was stamped by that clock, and a best published before it elsewhere won. Now the
    publish is stamped, as leases are, by the server's clock."""
    from datetime import datetime, timezone

    import tuner.db.best as best_module
    import tuner.db.models as models
    from tuner import db

    store = db.Store.open(postgres_sandbox.new_url())
    try:
        def behind() -> datetime:
            return datetime.now(timezone.utc) - timedelta(minutes=10)

        study = _study(store)
        measurement = store.record_measurement(_m(study.id))
        with monkeypatch.context() as skewed:  # this host's clock, 10 minutes behind
            skewed.setattr(models, "utcnow", behind)
            skewed.setattr(best_module, "utcnow", behind, raising=False)
            best = store.publish_best(study_id=study.id, measurement_id=measurement.id)
        assert abs(best.published_at - store.clock()) < timedelta(minutes=1)
    finally:
        store.close()
