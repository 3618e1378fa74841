"""Best configs: publish (upsert), refusals, lookups by key."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tuner.db import (
    BestRecord,
    MeasurementRecord,
    RecordConflictError,
    Store,
    StudyRecord,
    add_measurement,
    get_best,
    get_study_best,
    list_best,
    publish_best,
)
from tuner.db.models import StudyRow
from tuner.db.verifications import record_disproval
from tuner.errors import NotFoundError
from tuner.results import Status
from tuner.store.records import VERIFIED_LABEL

StudyFactory = Callable[..., StudyRecord]


def measure(
    store: Store, study: StudyRecord, median_us: float | None = 5.0, **fields: Any
) -> MeasurementRecord:
    values: dict[str, Any] = {
        "role": "final",
        "round_id": "r1",
        "candidate": "config",
        "config_json": {"BLOCK_H": 4, "num_warps": 2},
        "status": Status.OK,
        "median_us": median_us,
        "p20_us": None if median_us is None else median_us - 0.1,
        "p80_us": None if median_us is None else median_us + 0.2,
        "n_samples": 100,
        "timer": "cupti",
    }
    with store.session() as session:
        return add_measurement(session, study_id=study.id, **{**values, **fields})


def publish(store: Store, study: StudyRecord, measurement: MeasurementRecord) -> BestRecord:
    with store.session() as session:
        return publish_best(session, study_id=study.id, measurement_id=measurement.id)


def test_publish_copies_figures_from_the_measurement_and_key_from_the_study(
    store: Store, make_study: StudyFactory
) -> None:
    study = make_study()
    m = measure(store, study)
    best = publish(store, study, m)
    assert (best.study_id, best.measurement_id, best.config_json) == (study.id, m.id, m.config_json)
    assert (best.median_us, best.p20_us, best.p80_us, best.n_samples, best.timer) == (
        m.median_us, m.p20_us, m.p80_us, m.n_samples, m.timer,
    )  # fmt: skip
    for field in ("template", "template_version", "shape_key", "shape_json", "device_kind", "device_name"):
        assert getattr(best, field) == getattr(study, field)
    assert best.fingerprint_hash == study.fingerprint_hash
    assert best.config == {"BLOCK_H": 4, "num_warps": 2}
    with store.session(readonly=True) as session:
        assert get_study_best(session, study_id=study.id) == best


def test_publishing_again_replaces_the_study_best(store: Store, make_study: StudyFactory) -> None:
    study = make_study()
    first, second = measure(store, study, 5.0), measure(store, study, 4.0, config_json={"BLOCK_H": 8})
    old = publish(store, study, first)
    with store.session() as session:
        assert get_study_best(session, study_id=study.id) == old  # loads the row into this session
        new = publish_best(session, study_id=study.id, measurement_id=second.id)
    assert (new.measurement_id, new.median_us, new.config) == (second.id, 4.0, {"BLOCK_H": 8})
    assert new.published_at >= old.published_at
    with store.session(readonly=True) as session:
        assert list_best(session) == [new]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"status": Status.WRONG_RESULT, "reason": "off by 1e-2"}, "WRONG_RESULT"),
        ({"status": Status.TIMEOUT, "median_us": None}, "TIMEOUT"),
        ({"median_us": None}, "no median"),
        ({"candidate": "comparator:mamba_ssm"}, "comparator"),
    ],
)
def test_unpublishable_measurements_are_refused(
    store: Store, make_study: StudyFactory, fields: dict[str, Any], message: str
) -> None:
    study = make_study()
    good = publish(store, study, measure(store, study))
    bad = measure(store, study, **{"median_us": 1.0, **fields})  # faster, but not publishable
    with pytest.raises(RecordConflictError, match=message):
        publish(store, study, bad)
    with store.session(readonly=True) as session:
        assert get_study_best(session, study_id=study.id) == good  # untouched


def test_publishing_across_studies_or_missing_rows_is_refused(store: Store, make_study: StudyFactory) -> None:
    study, other = make_study(), make_study(S=8192)
    m = measure(store, other)
    with pytest.raises(RecordConflictError, match="belongs to study"):
        publish(store, study, m)
    with pytest.raises(NotFoundError), store.session() as session:
        publish_best(session, study_id=study.id, measurement_id=m.id + 100)
    with pytest.raises(NotFoundError), store.session() as session:
        publish_best(session, study_id=other.id + 100, measurement_id=m.id)
    with store.session(readonly=True) as session:
        assert list_best(session) == []


def test_get_best_filters_by_key_and_prefers_the_newest(store: Store, make_study: StudyFactory) -> None:
    base = make_study()
    other_fp = make_study(driver="575")
    other_gpu = make_study(device_name="NVIDIA H100")
    v2 = make_study(version="2")
    bests = {
        s.id: publish(store, s, measure(store, s, 5.0 + i))
        for i, s in enumerate((base, other_fp, other_gpu, v2))
    }
    key = {"template": base.template, "shape_key": base.shape_key, "device_kind": "cuda"}
    with store.session(readonly=True) as session:
        assert get_best(session, **key) == bests[v2.id]  # newest of the four
        assert get_best(session, **key, device_name="NVIDIA H100") == bests[other_gpu.id]
        assert get_best(session, **key, fingerprint_hash=other_fp.fingerprint_hash) == bests[other_fp.id]
        exact = get_best(
            session,
            **key,
            device_name=base.device_name,
            fingerprint_hash=base.fingerprint_hash,
            template_version="1",
        )
        assert exact == bests[base.id]
        assert get_best(session, **key, template_version="2") == bests[v2.id]
        assert get_best(session, **{**key, "shape_key": "B=2"}) is None
        assert get_best(session, **{**key, "device_kind": "npu"}) is None


def test_list_best_filters(store: Store, make_study: StudyFactory) -> None:
    a = make_study()
    b = make_study(template="mamba3_mimo_bwd")
    c = make_study(device_name="NVIDIA H100")
    best = {s.id: publish(store, s, measure(store, s)) for s in (a, b, c)}
    with store.session(readonly=True) as session:
        assert list_best(session) == [best[c.id], best[a.id], best[b.id]]  # by template, shape, device
        assert list_best(session, template="mamba3_mimo_bwd") == [best[b.id]]
        assert list_best(session, device_kind="cuda", device_name="NVIDIA H200") == [best[a.id], best[b.id]]
        assert list_best(session, device_kind="npu") == []


@pytest.mark.parametrize("published", [True, False], ids=["best", "no-best"])
def test_a_final_round_publishing_during_a_disproval_waits_for_it(
    store: Store, make_study: StudyFactory, published: bool
) -> None:
    """The disproval holds the study's best (its row, or the study's row while none is published) until it
    commits, even when it decided to leave the best as it is: a final round's publish waits and lands after
    it, never between its read and its write (PostgreSQL: FOR UPDATE; SQLite: the write lock)."""
    study = make_study()
    first = measure(store, study)
    later = measure(store, study, 4.0, round_id="r2", config_json={"BLOCK_H": 8, "num_warps": 2})
    best = publish(store, study, first) if published else None
    figures = [{"process": 1, "candidates": [{"label": VERIFIED_LABEL, "status": Status.WRONG_RESULT.value}]}]
    with store.session() as session:
        done = record_disproval(
            session, best_measurement_id=None if best is None else best.measurement_id,
            study_id=study.id, config_json=first.config_json, stored_us=5.0, median_us=None, low_us=None,
            high_us=None, drift=None, tolerance=0.03, flagged=True, processes=1, figures=figures,
            device_kind="cuda", device_name=study.device_name, fingerprint_hash="f", fingerprint_json="{}")
        assert done is not None and done.replacement is None  # decided: the best is left as it is
        thread, results = _publishing(store, study, later)  # a final round
        assert results == []  # it waits for the disproval
    thread.join(timeout=30)
    assert len(results) == 1 and isinstance(results[0], BestRecord), results
    with store.session(readonly=True) as session:
        assert get_study_best(session, study_id=study.id) == results[0]


def test_two_publishes_of_a_first_best_wait_for_each_other_without_a_deadlock(
    store: Store, make_study: StudyFactory
) -> None:
    """Every publish locks the study's row before it writes the best (publish_unless_disproved and
    record_disproval did, plain publish_best did not): a first best's insert took the study's key lock last,
    and on PostgreSQL two such publishes deadlocked (found by review)."""
    study = make_study()
    first = measure(store, study)
    later = measure(store, study, 4.0, round_id="r2", config_json={"BLOCK_H": 8, "num_warps": 2})
    with store.session() as session:
        session.get(StudyRow, study.id, with_for_update=True)  # a publish in progress holds the study
        thread, results = _publishing(store, study, later)
        mine = publish_best(session, study_id=study.id, measurement_id=first.id)
    thread.join(timeout=30)
    assert len(results) == 1 and isinstance(results[0], BestRecord), results
    with store.session(readonly=True) as session:
        assert get_study_best(session, study_id=study.id) == results[0] != mine


def _publishing(
    store: Store, study: StudyRecord, measurement: MeasurementRecord
) -> tuple[threading.Thread, list[BestRecord | BaseException]]:
    """Publish ``measurement`` in another thread (another writer), given half a second to reach its lock:
    the thread, and the list its result or error lands in."""
    results: list[BestRecord | BaseException] = []

    def run() -> None:
        try:
            results.append(publish(store, study, measurement))
        except BaseException as exc:  # reported by the caller's asserts
            results.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.5)
    return thread, results
