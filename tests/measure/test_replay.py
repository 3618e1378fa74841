"""The replay device: a small real sweep is recorded on the CPU (Triton interpreter, the fault-injection
template, so that the record holds every status), then the whole driver runs again from the record alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.fixtures.fault_templates import TUNABLE_REF
from tests.fixtures.recorded import NAME, SHAPES
from tuner import db, registry
from tuner.cli.app import app
from tuner.driver.budget import CountBudget
from tuner.driver.study import open_study
from tuner.driver.trials import run_trials
from tuner.driver.tuning import tune_shapes
from tuner.errors import DeviceError
from tuner.frozen import Config, Shape
from tuner.measure.devices.replay import NOT_RECORDED, Record, ReplayMeasurer
from tuner.measure.measurer import MeasureOptions
from tuner.measure.protocol import Candidate
from tuner.results import Status


@pytest.fixture
def recorded(recorded_sweep: str) -> str:
    registry.register(NAME, TUNABLE_REF)
    return recorded_sweep


def test_the_record_holds_every_outcome_and_replays_it(recorded: str) -> None:
    record = Record.load(db.Store.open(recorded, migrate_schema=False), NAME)
    assert set(record.configs) == set(SHAPES)
    assert len(record.configs[SHAPES[0]]) == 4 * 3 and len(record.configs[SHAPES[1]]) == 4 * 4
    replay = ReplayMeasurer(record, MeasureOptions(n_samples=50))
    for shape in SHAPES:
        for config, outcome in record.configs[shape].items():
            result = replay.measure(NAME, shape, Candidate(config=config), seed=1)
            assert (result.status, result.reason, result.config) == (outcome.status, outcome.reason, config)
            if outcome.status is Status.OK:
                assert outcome.quantiles is not None and result.summary is not None
                low, *_, high = outcome.quantiles
                assert result.summary.n == 50 and low <= result.summary.min_us <= result.summary.max_us <= high
                assert outcome.quantiles[1] <= result.median_us <= outcome.quantiles[3]  # type: ignore[operator]
    statuses = {c["mode"]: r.status for c, r in record.configs[SHAPES[1]].items()}
    assert statuses == {"ok": Status.OK, "wrong": Status.WRONG_RESULT, "compile_error": Status.COMPILE_ERROR,
                        "raise": Status.RUNTIME_ERROR}
    # Noise is drawn afresh per seed, the same for the same seed.
    ok = next(c for c, r in record.configs[SHAPES[0]].items() if r.status is Status.OK)
    medians = {replay.measure(NAME, SHAPES[0], Candidate(config=ok), seed=s).median_us for s in range(6)}
    assert len(medians) > 1
    assert replay.measure(NAME, SHAPES[0], Candidate(config=ok), seed=3) == \
        replay.measure(NAME, SHAPES[0], Candidate(config=ok), seed=3)


def test_configs_shapes_and_comparators_missing_from_the_record_say_so(recorded: str) -> None:
    record = Record.load(db.Store.open(recorded, migrate_schema=False), NAME)
    replay = ReplayMeasurer(record)
    unrecorded, torch, missing, other_shape = replay.measure_interleaved(NAME, SHAPES[0], [
        Candidate(config=Config(mode="nan", BLOCK=16)), Candidate(comparator="torch"), Candidate(comparator="missing"),
    ]) + replay.measure_interleaved(NAME, Shape(n=32), [Candidate(config=Config(mode="ok", BLOCK=16))])
    assert unrecorded.status is Status.INVALID and unrecorded.reason is not None
    assert unrecorded.reason.startswith(f"{NOT_RECORDED}: BLOCK=16,mode=nan of n=64 is not in the record")
    assert other_shape.status is Status.INVALID and "the shape of n=32" in (other_shape.reason or "")
    assert torch.status is Status.OK and torch.config == Config(comparator="torch")
    assert missing.status is Status.INVALID and (missing.reason or "").startswith("unavailable")
    with pytest.raises(DeviceError, match="holds no study of nothing_here"):
        Record.load(db.Store.open(recorded, migrate_schema=False), "nothing_here")


def test_the_whole_driver_runs_from_the_record(recorded: str, tmp_path: Path) -> None:
    """Samplers, warm starts from a neighbouring shape, pruning, the final round with comparators and
    publication, on the CPU with no kernel: the published bests are the record's fastest configs."""
    record = Record.load(db.Store.open(recorded, migrate_schema=False), NAME)
    store = db.Store.open(db.sqlite_url(tmp_path / "replayed.db"))
    replay = ReplayMeasurer(record, MeasureOptions(n_samples=20))
    first = tune_shapes(NAME, [("n64", SHAPES[0])], store=store, measurer=replay, trials=16, sampler="tpe", seed=0)
    # n=64: 12 recorded configs of the subspace, the other modes come back as not recorded.
    records = first[0].trials
    assert {r.status for r in records} >= {Status.OK, Status.WRONG_RESULT, Status.INVALID}
    assert any(NOT_RECORDED in (r.reason or "") for r in records)
    assert any("a block larger than the vector" in (r.reason or "") for r in records)  # pruned, not measured
    final = first[0].final
    assert final.winner is not None and final.published
    labels = {e.label: e.result.status for e in final.entries}
    assert labels["comparator:torch"] is Status.OK and labels["comparator:missing"] is Status.INVALID
    # The winner is the fastest re-measured config of the round (CPU records are noisy: not always the
    # record's fastest), a recorded OK config, and it is what the store serves now.
    configs = [e.result for e in final.entries if not e.label.startswith("comparator:") and e.result.ok]
    assert final.winner.result == min(configs, key=lambda r: r.median_us or 0.0)
    assert record.configs[SHAPES[0]][final.winner.result.config].status is Status.OK
    with store.session() as session:
        served = db.get_best(session, template=NAME, shape_key=SHAPES[0].key())
    assert served is not None and Config.from_json(served.config_json) == final.winner.result.config

    # n=128 is warm-started from n=64's published best: its first trials are the default, then that config.
    ctx = open_study(NAME, SHAPES[1], store=store, measurer=replay, sampler="random", seed=1)
    early = [r.config for r in run_trials(ctx, CountBudget(2)) if r.status is not Status.INVALID]
    expected = [Config(mode="ok", BLOCK=64)]  # the space's default
    if final.winner.result.config not in expected:
        expected.append(final.winner.result.config)
    assert early[: len(expected)] == expected
    with store.session() as session:
        rows = db.list_measurements(session, study_id=ctx.study_id, role="trial")
    recorded_rows = [r for r in rows if r.status is not Status.INVALID]
    assert [Config.from_json(r.config_json) for r in recorded_rows] == early
    assert all(r.timer == record.configs[SHAPES[1]][Config.from_json(r.config_json)].timer for r in recorded_rows)


def test_tuner_tune_replays_a_record_from_the_command_line(recorded: str, tmp_path: Path) -> None:
    url = db.sqlite_url(tmp_path / "cli.db")
    registry.register(NAME, TUNABLE_REF)
    result = CliRunner().invoke(app, ["tune", NAME, "--shape", "n=128", "--device", "replay", "--record", recorded,
                                      "--db", url, "--trials", "10", "--samples", "10", "--no-comparators"])
    assert result.exit_code == 0, result.output
    assert "published" in result.output
    result = CliRunner().invoke(app, ["tune", NAME, "--shape", "n=128", "--device", "replay", "--db", url])
    assert result.exit_code == 2 and "--device replay needs --record URL" in result.output


def test_a_config_rejected_under_a_stricter_space_and_measured_since_replays_its_measurement(
    recorded: str, tmp_path: Path
) -> None:
    """A space rejection stored before the config's measurement (the space was stricter then): the record
    keeps the measurement, not the first row; the replay device's own "not recorded" answer is no such
    rejection (sweeps count it as an outcome)."""

    from tuner.driver.study import CONFIG_LABEL, new_measurement
    from tuner.results import MeasureResult, SampleSummary, is_space_rejection

    path = tmp_path / "copy.db"
    db.copy_database(db.sqlite_file(recorded) or recorded, path)
    store = db.Store.open(db.sqlite_url(path), migrate_schema=False)
    late = Config(mode="ok", BLOCK=8192)  # not in the record
    assert late not in Record.load(store, NAME).configs[SHAPES[0]]
    (study,) = [s for s in store.list_studies(template=NAME) if s.shape_key == SHAPES[0].key()]
    for result in (MeasureResult(Status.INVALID, late, reason="C = 2 steps"),  # first, by id
                   MeasureResult(Status.OK, late, SampleSummary.of([5.0, 6.0, 7.0]))):
        store.record_measurement(new_measurement(result, study_id=study.id, role="trial", candidate=CONFIG_LABEL))
    assert Record.load(store, NAME).configs[SHAPES[0]][late].status is Status.OK
    assert is_space_rejection(Status.INVALID, "C = 2 steps")
    assert not is_space_rejection(Status.INVALID, f"{NOT_RECORDED}: x of n=1 is not in the record r")
    assert not is_space_rejection(Status.OK, None)
