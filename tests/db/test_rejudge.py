"""``tuner rejudge``: today's publishing rule replayed over stored final rounds (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from tuner.db import MeasurementRecord, Store, StudyRecord, add_measurement, publish_best
from tuner.driver.rejudge import rejudge, rejudge_template, replay, rounds_of
from tuner.frozen import Config
from tuner.results import Status

StudyFactory = Callable[..., StudyRecord]
WIDE, NARROW, OTHER = {"BLOCK_H": 8, "num_warps": 4}, {"BLOCK_H": 4, "num_warps": 4}, {"BLOCK_H": 2, "num_warps": 2}


def row(store: Store, study: StudyRecord, round_id: str, config: dict[str, Any], median_us: float,
        p80_us: float | None = None, status: Status = Status.OK, candidate: str = "config") -> MeasurementRecord:
    ok = status is Status.OK
    with store.session() as session:
        return add_measurement(
            session, study_id=study.id, role="final", round_id=round_id, candidate=candidate, config_json=config,
            status=status, median_us=median_us if ok else None, p20_us=median_us - 0.01 if ok else None,
            p80_us=(median_us + 0.02 if p80_us is None else p80_us) if ok else None, n_samples=100,
            timer="cupti")


def publish(store: Store, study: StudyRecord, measurement: MeasurementRecord, at: datetime | None = None) -> None:
    with store.session() as session:
        publish_best(session, study_id=study.id, measurement_id=measurement.id, published_at=at)


def test_a_noise_level_win_published_by_the_old_rule_is_replayed_back_to_the_served_config(
    store: Store, make_study: StudyFactory,
) -> None:
    """The H200 case: round 1 publishes block_h 8; round 2's block_h 4 is 0.9% faster, its p80 above the
    served config's median, and the old rule published it. The replay serves block_h 8 with round 2's figures;
    --apply publishes it at the replaced best's time, and a second rejudge finds nothing to change."""
    study = make_study()
    row(store, study, "r1", WIDE, 3.70)
    row(store, study, "r1", OTHER, 4.10)
    row(store, study, "r1", {}, 9.0, candidate="comparator:mamba_ssm")  # a comparator is not a config
    row(store, study, "r2", NARROW, 3.65, p80_us=3.72)
    kept = row(store, study, "r2", WIDE, 3.68)
    noise_win = row(store, study, "r2", OTHER, 4.0)
    at = datetime(2026, 12, 5, 2, 40, tzinfo=timezone.utc)
    publish(store, study, store.list_measurements(study_id=study.id, round_id="r2", order="median_us")[0], at)
    assert noise_win.id  # (the slower row is ignored by the rule too)

    found = rejudge(store, study)
    assert (found.replayed.config, found.replayed.row, found.replayed.rounds, found.replayed.kept) == (
        Config(WIDE), kept, 2, 1)
    assert found.changed and not found.applied
    assert store.get_study_best(study_id=study.id).config == NARROW  # only shown

    applied = rejudge(store, study, apply=True)
    assert applied.applied and applied.best is not None
    best = store.get_study_best(study_id=study.id)
    assert (best.config, best.measurement_id, best.median_us) == (WIDE, kept.id, 3.68)
    assert best.published_at == at  # the shape's place among its studies stays
    assert not rejudge(store, study).changed


def test_a_clear_win_replaces_the_served_config_and_a_disproved_config_is_never_served(
    store: Store, make_study: StudyFactory,
) -> None:
    study = make_study()
    row(store, study, "r1", WIDE, 3.70)
    row(store, study, "r2", WIDE, 3.70)
    clear = row(store, study, "r2", NARROW, 3.40, p80_us=3.50)  # p80 under the served median: clearly faster
    found = replay(rounds_of(store.list_measurements(study_id=study.id, role="final")), set())
    assert (found.config, found.row, found.kept) == (Config(NARROW), clear, 0)

    # a third round found NARROW wrong on its inputs: no round serves it any more, WIDE comes back
    row(store, study, "r3", NARROW, 0.0, status=Status.WRONG_RESULT)
    back = row(store, study, "r3", WIDE, 3.71)
    publish(store, study, clear)
    found = rejudge(store, study, apply=True)
    assert (found.replayed.config, found.replayed.row, found.applied) == (Config(WIDE), back, True)
    assert store.get_study_best(study_id=study.id).measurement_id == back.id


def test_studies_without_a_published_best_or_of_another_version_are_left_alone(
    store: Store, make_study: StudyFactory,
) -> None:
    unpublished = make_study(S=1024)
    row(store, unpublished, "r1", WIDE, 3.7)
    old = make_study(S=2048, version="1")
    publish(store, old, row(store, old, "o1", OTHER, 5.0))
    row(store, old, "o2", OTHER, 5.0)
    row(store, old, "o2", WIDE, 4.99)
    current = make_study(S=8192, version="2")
    publish(store, current, row(store, current, "c1", WIDE, 3.0))
    template = current.template
    assert [r.study.id for r in rejudge_template(store, template)] == [old.id, current.id]  # oldest first
    assert [r.changed for r in rejudge_template(store, template)] == [False, False]  # 4.99 is noise
    found = rejudge_template(store, template, version="2", shape_keys={current.shape_key}, apply=True)
    assert [(r.study.id, r.changed, r.applied) for r in found] == [(current.id, False, False)]
    assert store.get_study_best(study_id=unpublished.id) is None
