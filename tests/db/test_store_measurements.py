"""Measurements: round trip of every field, MeasureResult adapter, filters, ordering, final rounds."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pytest

from tuner.db import (
    MeasurementRecord,
    Store,
    StudyRecord,
    add_measurement,
    count_measurements,
    get_measurement,
    latest_round,
    list_measurements,
)
from tuner.driver.study import new_measurement, process_label
from tuner.errors import NotFoundError
from tuner.frozen import Config
from tuner.results import MeasureResult, PhaseTimes, SampleSummary, Status, Timer

StudyFactory = Callable[..., StudyRecord]

ALL_FIELDS: dict[str, Any] = {
    "role": "final",
    "round_id": "r-7",
    "candidate": "comparator:mamba_ssm",
    "trial_number": 41,
    "config_json": {"BLOCK_H": 4, "num_warps": 2},
    "status": Status.OK,
    "reason": None,
    "errors_json": {"dA_cumsum": 1.5e-7, "dt_out": 2.5e-4},
    "median_us": 5.79,
    "p20_us": 5.71,
    "p80_us": 5.9,
    "mean_us": 5.83,
    "min_us": 5.6,
    "max_us": 7.25,
    "n_samples": 100,
    "timer": Timer.CUPTI,
    "build_s": 1.25,
    "verify_s": 0.5,
    "measure_s": 0.75,
    "worker": "gpu-host-3/4242",
}


def test_every_field_round_trips(store: Store, make_study: StudyFactory) -> None:
    study = make_study()
    with store.session() as session:
        added = add_measurement(session, study_id=study.id, **ALL_FIELDS)
    with store.session(readonly=True) as session:
        read = get_measurement(session, measurement_id=added.id)
    assert read == added
    assert isinstance(read, MeasurementRecord)
    expected = {
        **ALL_FIELDS,
        "config_json": '{"BLOCK_H":4,"num_warps":2}',
        "errors_json": '{"dA_cumsum":1.5e-07,"dt_out":0.00025}',
        "timer": "cupti",
    }
    stored = asdict(read)
    assert {name: stored[name] for name in expected} == expected
    assert read.study_id == study.id and read.ok and read.status is Status.OK
    assert read.config == {"BLOCK_H": 4, "num_warps": 2}
    assert read.errors == {"dA_cumsum": 1.5e-7, "dt_out": 2.5e-4}


def test_measure_results_are_stored_through_the_adapter(store: Store, make_study: StudyFactory) -> None:
    study = make_study()
    config = Config(BLOCK_H=8, num_warps=4)
    ok = MeasureResult(
        Status.OK,
        config,
        SampleSummary.of([3.0, 1.0, 2.0, 4.0, 5.0]),
        {"out": 1e-6},
        timer=Timer.CPU_WALL,
        phases=PhaseTimes(2.0, 0.25, 1.0),
    )
    wrong = MeasureResult(Status.WRONG_RESULT, config, errors={"out": math.nan}, reason="out is NaN")
    invalid = MeasureResult(Status.INVALID, config, reason="BLOCK_H > H")
    a = store.record_measurement(
        new_measurement(ok, study_id=study.id, role="trial", candidate="config", trial_number=0)
    )
    b = store.record_measurement(new_measurement(wrong, study_id=study.id, role="trial", candidate="config"))
    c = store.record_measurement(new_measurement(invalid, study_id=study.id, role="trial", candidate="default"))
    assert (a.median_us, a.p20_us, a.p80_us) == pytest.approx((3.0, 1.8, 4.2))
    assert (a.n_samples, a.timer) == (5, "cpu-wall")
    assert (a.min_us, a.max_us, a.mean_us) == (1.0, 5.0, 3.0)
    assert (a.build_s, a.verify_s, a.measure_s, a.trial_number) == (2.0, 0.25, 1.0, 0)
    assert Config.from_json(a.config_json) == config
    assert b.status is Status.WRONG_RESULT and b.reason == "out is NaN" and math.isnan(b.errors["out"])
    assert b.median_us is None and b.timer is None
    assert c.status is Status.INVALID and c.errors == {} and c.candidate == "default"
    with store.session(readonly=True) as session:
        assert list_measurements(session, study_id=study.id) == [a, b, c]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"role": "sweep"}, "role"),
        ({"candidate": "mine"}, "candidate"),
        ({"candidate": "comparator:"}, "candidate"),
        ({"status": "FINE"}, "FINE"),
        ({"timer": "sundial"}, "sundial"),
        ({"config_json": "{oops"}, "config_json"),
        ({"errors_json": {"out": object()}}, "errors_json"),
    ],
)
def test_invalid_arguments_are_refused(
    store: Store, make_study: StudyFactory, change: dict[str, Any], message: str
) -> None:
    study = make_study()
    with pytest.raises(ValueError, match=message), store.session() as session:
        add_measurement(session, study_id=study.id, **{**ALL_FIELDS, **change})
    with store.session(readonly=True) as session:
        assert count_measurements(session, study_id=study.id) == 0


def test_a_measurement_of_a_missing_study_is_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError), store.session() as session:
        add_measurement(session, study_id=999, **ALL_FIELDS)


def _add(session: Any, study_id: int, **fields: Any) -> MeasurementRecord:
    base: dict[str, Any] = {"role": "trial", "candidate": "config", "config_json": {}, "status": "OK"}
    return add_measurement(session, study_id=study_id, **{**base, **fields})


def test_list_and_count_filter_order_and_page(store: Store, make_study: StudyFactory) -> None:
    study, other = make_study(), make_study(S=8192)
    with store.session() as session:
        slow = _add(session, study.id, median_us=9.0, worker=process_label())
        fast = _add(session, study.id, median_us=2.0)
        crash = _add(session, study.id, status=Status.RUNTIME_ERROR, reason="illegal address")
        final = _add(session, study.id, role="final", round_id="r1", median_us=2.1)
        _add(session, other.id, median_us=1.0)
    with store.session(readonly=True) as session:

        def ids(**filters: Any) -> list[int]:
            return [m.id for m in list_measurements(session, study_id=study.id, **filters)]

        assert ids() == [slow.id, fast.id, crash.id, final.id]
        assert ids(order="-id") == [final.id, crash.id, fast.id, slow.id]
        assert ids(order="median_us") == [fast.id, final.id, slow.id, crash.id]
        assert ids(role="trial", status="OK") == [slow.id, fast.id]
        assert ids(status=Status.RUNTIME_ERROR) == [crash.id]
        assert ids(round_id="r1") == [final.id]
        assert ids(limit=2, offset=1) == [fast.id, crash.id]
        assert count_measurements(session, study_id=study.id) == 4
        assert count_measurements(session, study_id=study.id, role="trial", status="OK") == 2
        assert count_measurements(session, study_id=12345) == 0
        with pytest.raises(ValueError, match="order"):
            list_measurements(session, study_id=study.id, order="fastest")
    assert slow.worker is not None and slow.worker.endswith(f"/{os.getpid()}")


def test_latest_round_returns_the_newest_final_round(store: Store, make_study: StudyFactory) -> None:
    study = make_study()
    with store.session() as session:
        assert latest_round(session, study_id=study.id) == []
        _add(session, study.id, role="final", round_id="first", median_us=3.0)
        _add(session, study.id, role="final", round_id="first", median_us=4.0)
        _add(session, study.id, trial_number=9, median_us=1.0)  # a later trial is not a round
        newest = [
            _add(session, study.id, role="final", round_id="second", candidate=c, median_us=m)
            for c, m in (("config", 2.0), ("default", 2.5), ("comparator:mamba_ssm", 2.2))
        ]
        _add(session, study.id, trial_number=10, median_us=1.5)
    with store.session(readonly=True) as session:
        assert latest_round(session, study_id=study.id) == newest
