"""A measurement taken while its worker was cut off from the store long enough to be reaped (its trial slot
given back): kept on a new slot when the task has a trial left, dropped (its config queued again) when the
others took every trial meanwhile. Real studies in SQLite and PostgreSQL, real CPU measurements."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import TypeVar

import optuna
import pytest

from tests.fixtures.fault_templates import WIDE_REF
from tests.fixtures.faults import WIDE, submit
from tuner import db, registry
from tuner.driver import optuna_access
from tuner.driver.study import open_study
from tuner.driver.trials import run_trials
from tuner.errors import SlotLostError
from tuner.frozen import Shape
from tuner.measure.devices.base import DeviceSpec
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.results import Status
from tuner.service.worker import SlotBudget

T = TypeVar("T")


@pytest.fixture(scope="module")
def measurer() -> Iterator[Measurer]:
    registry.register(WIDE, WIDE_REF)
    with Measurer(DeviceSpec("cpu"), MeasureOptions(n_samples=2, warmup=1, timeout_s=60)) as m:
        yield m


class ReapedDuringOutage:
    """A ``persist`` for run_trials: the first write of a measurement meets a store that, meanwhile, declared
    this worker lost and gave its slots back (then ``meanwhile`` runs: what the others did)."""

    def __init__(self, store: db.Store, meanwhile: Callable[[], object] = lambda: None) -> None:
        self.store, self.meanwhile, self.done = store, meanwhile, False

    def __call__(self, write: Callable[[], T]) -> T:
        if not self.done:
            self.done = True
            later = datetime.now(timezone.utc) + timedelta(hours=1)
            assert self.store.reap_lost_workers(now=later) == ["w"]
            self.meanwhile()
        return write()


def _start(db_url: str, measurer: Measurer, trials: int) -> tuple[db.Store, int, SlotBudget, object]:
    store = db.Store.open(db_url)
    submit(store, trials=trials)
    store.register_worker(
        worker_id="w",
        host="h",
        pid=1,
        device_kind="cpu",
        device_name="CPU",
        device_index=0,
        backends=["triton"],
        fingerprint_hash="f",
        fingerprint_json="{}",
        lease_s=30.0,
    )
    claim = store.claim_task(worker_id="w", device_kind="cpu", device_name="CPU", backends=["triton"])
    assert claim is not None
    ctx = open_study(WIDE, Shape(n=256), store=store, measurer=measurer, sampler="random", seed=1)
    store.attach_study(task_id=claim.task.id, study_id=ctx.study_id)
    return store, claim.task.id, SlotBudget(store, claim.task.id, "w"), ctx


def test_a_measurement_whose_slot_was_reaped_is_kept_on_a_new_slot(db_url: str, measurer: Measurer) -> None:
    store, task_id, budget, ctx = _start(db_url, measurer, trials=3)
    records = run_trials(ctx, budget, persist=ReapedDuringOutage(store))  # type: ignore[arg-type]
    task = store.get_task(task_id=task_id)
    rows = [r for r in store.list_measurements(study_id=task.study_id, role="trial") if r.status is not Status.INVALID]
    assert len([r for r in records if r.measured]) == 3 and task.trials_done == task.trials_reserved == 3
    assert len(rows) == 3 and len({r.config_json for r in rows}) == 3
    assert 0 in {r.trial_number for r in rows}, "the trial measured during the outage is kept"
    study = optuna.load_study(study_name=ctx.key.study_name(), storage=store.optuna_url)  # type: ignore[attr-defined]
    assert study.trials[0].state is optuna.trial.TrialState.COMPLETE
    store.close()


def test_a_measurement_whose_slot_was_reaped_and_taken_is_dropped_and_queued_again(
    db_url: str, measurer: Measurer
) -> None:
    store, task_id, budget, ctx = _start(db_url, measurer, trials=1)
    taken = ReapedDuringOutage(store, lambda: store.reserve_slot(task_id=task_id, worker_id="other"))
    with pytest.raises(SlotLostError):
        run_trials(ctx, budget, persist=taken)  # type: ignore[arg-type]
    task = store.get_task(task_id=task_id)
    assert task.trials_done == 0 and task.trials_reserved == 1  # the other worker's slot only
    rows = store.list_measurements(study_id=ctx.study_id, role="trial")  # type: ignore[attr-defined]
    assert [r for r in rows if r.status is not Status.INVALID] == []
    study = optuna.load_study(study_name=ctx.key.study_name(), storage=store.optuna_url)  # type: ignore[attr-defined]
    measured = [t for t in study.trials if t.user_attrs.get("status") != "INVALID"]
    assert [t.state for t in measured] == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING]
    assert optuna_access.queued_params(measured[1]) == measured[0].params, "its config queued again"
    store.close()
