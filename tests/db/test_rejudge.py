"""``tuner rejudge``: today's publishing rule replayed over stored final rounds (SQLite and PostgreSQL)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from tests.fixtures.fault_templates import TunableFaultVectorScale
from tests.fixtures.sweeps import NAME, store_sweep
from tuner.db import MeasurementRecord, Store, StudyRecord, add_measurement, get_or_create_study, publish_best
from tuner.driver.rejudge import rejudge, rejudge_template, replay, rounds_of
from tuner.frozen import Config, Shape
from tuner.keys import StudyKey
from tuner.measure.devices.base import Fingerprint
from tuner.results import Status
from tuner.spec import CarriedVersion, TemplateSpec

StudyFactory = Callable[..., StudyRecord]
WIDE, NARROW, OTHER = {"BLOCK_H": 8, "num_warps": 4}, {"BLOCK_H": 4, "num_warps": 4}, {"BLOCK_H": 2, "num_warps": 2}


def row(store: Store, study: StudyRecord, round_id: str, config: dict[str, Any], median_us: float,
        p80_us: float | None = None, status: Status = Status.OK, candidate: str = "config",
        errors: dict[str, float] | None = None) -> MeasurementRecord:
    ok = status is Status.OK
    with store.session() as session:
        return add_measurement(
            session, study_id=study.id, role="final", round_id=round_id, candidate=candidate, config_json=config,
            status=status, median_us=median_us if ok else None, p20_us=median_us - 0.01 if ok else None,
            p80_us=(median_us + 0.02 if p80_us is None else p80_us) if ok else None, n_samples=100,
            timer="cupti", errors_json=errors or {})


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
    row(store, study, "r2", OTHER, 4.0)
    at = datetime(2026, 12, 5, 2, 40, tzinfo=timezone.utc)
    publish(store, study, store.list_measurements(study_id=study.id, round_id="r2", order="median_us")[0], at)

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


def test_the_first_round_keeps_the_carried_config_the_lookup_served(store: Store, make_study: StudyFactory) -> None:
    """Before a study's first round the lookup served the shape a carried version's best: a round of today
    measures it beside the finalists and keeps it unless the fastest is clearly faster; so does the replay."""
    study = make_study()
    row(store, study, "r1", NARROW, 3.65, p80_us=3.72)
    carried = row(store, study, "r1", WIDE, 3.68)
    rounds = rounds_of(store.list_measurements(study_id=study.id, role="final"))
    assert replay(rounds, set()).config == Config(NARROW)  # nothing served before: the fastest
    kept = replay(rounds, set(), served=Config(WIDE))
    assert (kept.config, kept.row, kept.kept) == (Config(WIDE), carried, 1)
    # a served config that no round measured stays served, with nothing to publish
    nothing = replay([], set(), served=Config(OTHER))
    assert (nothing.config, nothing.row, nothing.rounds) == (Config(OTHER), None, 0)


def test_rejudge_template_judges_as_a_round_of_today_and_leaves_other_studies_alone(store: Store) -> None:
    """With the registered template: a config no longer valid for the shape and a row within the final
    round's headroom of its error bound are not published; studies of another version, without a best or of
    another shape are not judged. --apply keeps what it replaced on its record and publishes once."""
    template = TunableFaultVectorScale()
    sweep = store_sweep(store, shape={"n": 256})  # round r1: BLOCK 256 published (19 µs), default BLOCK 64
    study = store.get_study(study_id=sweep.study_id)
    assert study is not None
    row(store, study, "r2", {"mode": "ok", "BLOCK": 256}, 19.0)
    kept = row(store, study, "r2", {"mode": "ok", "BLOCK": 128}, 18.9, p80_us=19.1)  # noise: not clearly faster
    row(store, study, "r2", {"mode": "ok", "BLOCK": 512}, 5.0)  # BLOCK > n: not a valid config at n=256
    near = row(store, study, "r2", {"mode": "ok", "BLOCK": 64}, 9.0, errors={"y": 0.99e-6})  # 0.99 of 1e-6
    publish(store, study, near)  # as an older rule published it
    old = store_sweep(store, shape={"n": 512}, version="0")
    unpublished = store_sweep(store, shape={"n": 1024})
    store.withdraw_best(study_id=unpublished.study_id)
    other = store_sweep(store, shape={"n": 2048})

    found = rejudge_template(store, template)
    assert [r.study.id for r in found] == [sweep.study_id, other.study_id]  # oldest first
    judged = found[0]
    assert judged.replayed.config == Config({"mode": "ok", "BLOCK": 256}) and judged.changed
    assert judged.replayed.row is not None and judged.replayed.row.round_id == "r2"
    assert not found[1].changed and old.study_id not in [r.study.id for r in found]

    (applied,) = rejudge_template(store, template, shape_keys={study.shape_key}, apply=True)
    assert applied.applied and applied.changed and applied.best is not None
    assert applied.best.measurement_id == near.id  # what it replaced stays on the record
    assert applied.published is not None and applied.published.measurement_id == judged.replayed.row.id
    assert applied.published.published_at == applied.best.published_at
    (again,) = rejudge_template(store, template, shape_keys={study.shape_key}, apply=True)
    assert not again.changed and not again.applied
    assert again.replayed.row is not None and again.replayed.row.id != kept.id  # not the noise-level win


def test_a_config_a_round_of_today_refuses_stays_refused_in_later_rounds(
    store: Store, make_study: StudyFactory,
) -> None:
    """A round of today stores a row short of the headroom as WRONG_RESULT, which disproves its config for
    good: the replay leaves the config out of every round, not only the round whose row it refuses."""
    study = make_study()
    row(store, study, "r1", WIDE, 3.70, errors={"y": 0.98})
    row(store, study, "r1", OTHER, 3.90)
    row(store, study, "r2", WIDE, 3.20, errors={"y": 0.96})  # alone, within the headroom
    other = row(store, study, "r2", OTHER, 3.90)
    rounds = rounds_of(store.list_measurements(study_id=study.id, role="final"))

    def admits(r: MeasurementRecord, _config: Config) -> bool:
        return r.errors.get("y", 0.0) < 0.97

    found = replay(rounds, set(), admits=admits)
    assert (found.config, found.row) == (Config(OTHER), other)
    assert replay(rounds, set()).config == Config(WIDE)  # without the check, the faster config


class CarriedTunable(TunableFaultVectorScale):
    """The tunable template's version 2, which carries version 1's bests (as MIMO version 4 carries 3)."""

    version = "2"

    @property
    def spec(self) -> TemplateSpec:
        return dataclasses.replace(super().spec, version="2", carries=(CarriedVersion("1"),))


def _other_fingerprint_study(store: Store, n: int) -> StudyRecord:
    """A version-2 study of n on the sweeps' device under another driver, with a published round first."""
    fingerprint = Fingerprint(kind="cpu", device_name="test-cpu", driver="other",
                              libraries={"torch": "2.13", "triton": "3.6"})  # type: ignore[arg-type]
    shape = Shape({"n": n})
    key = StudyKey.of(NAME, "2", shape, fingerprint)
    with store.session() as session:
        study = get_or_create_study(
            session, name=key.study_name(), template=NAME, template_version="2", shape_key=key.shape_key,
            shape_json=shape.to_json(), device_kind="cpu", device_name="test-cpu",
            fingerprint_hash=key.fingerprint_hash, fingerprint_json=fingerprint.to_json())
    publish(store, study, row(store, study, "o1", {"mode": "ok", "BLOCK": 256}, 19.0))
    return study


def test_the_carried_best_is_served_before_a_first_round_unless_the_version_served_its_own(store: Store) -> None:
    """Before a study's first round the lookup served the carried version's best for its shape — unless a
    study of the same version there (another fingerprint's) had published first: then nothing was carried."""
    template = CarriedTunable()
    store_sweep(store, shape={"n": 256}, version="1")  # version 1's best of n=256: BLOCK 256
    fresh = store_sweep(store, shape={"n": 256}, version="2")  # its round r1: BLOCK 256 at 19 µs, default 38
    study = store.get_study(study_id=fresh.study_id)
    assert study is not None
    noise = row(store, study, "r1", {"mode": "ok", "BLOCK": 128}, 18.9, p80_us=19.1)
    publish(store, study, noise)  # as the rule before the carried config was kept published it
    (found,) = rejudge_template(store, template)
    assert found.changed and found.replayed.kept == 1
    assert found.replayed.config == Config({"mode": "ok", "BLOCK": 256})

    store_sweep(store, shape={"n": 512}, version="1")
    own = _other_fingerprint_study(store, 512)  # version 2 served its own best at n=512 first
    later = store_sweep(store, shape={"n": 512}, version="2")
    later_study = store.get_study(study_id=later.study_id)
    assert later_study is not None
    publish(store, later_study, row(store, later_study, "r1", {"mode": "ok", "BLOCK": 128}, 18.9, p80_us=19.1))
    judged = {r.study.id: r for r in rejudge_template(store, template, shape_keys={later_study.shape_key})}
    assert not judged[later.study_id].changed and judged[later.study_id].replayed.kept == 0
    assert not judged[own.id].changed
