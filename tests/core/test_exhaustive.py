"""Exhaustive sweeps end to end: the real driver, the store, and measurements on the CPU backend (Triton
interpreter) of the fault-injection template, whose configs produce every status."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from tests.fixtures.fault_templates import TUNABLE_REF
from tuner import db, registry
from tuner.cli.app import app
from tuner.driver.budget import CountBudget
from tuner.driver.exhaustive import ExhaustivePlan, ExhaustiveSampler, measured_configs, parse_only
from tuner.driver.study import open_study
from tuner.driver.trials import run_trials
from tuner.driver.tuning import tune_shapes
from tuner.errors import UserInputError
from tuner.frozen import Config, Shape
from tuner.measure.devices.base import DeviceSpec
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.results import Status

NAME = "fault_vector_scale_tunable"
MODES = ("ok", "wrong", "compile_error", "raise")


@pytest.fixture(scope="module")
def measurer() -> Iterator[Measurer]:
    registry.register(NAME, TUNABLE_REF)
    with Measurer(DeviceSpec("cpu"), MeasureOptions(n_samples=3, warmup=1, timeout_s=60)) as m:
        yield m


def _trial_rows(store: db.Store, study_id: int) -> list[db.MeasurementRecord]:
    with store.session() as session:
        return db.list_measurements(session, study_id=study_id, role="trial")


def test_an_interrupted_sweep_resumes_and_measures_each_valid_config_once(tmp_path: Path, measurer: Measurer) -> None:
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    shape = Shape(n=64)
    space = registry.get(NAME).space()
    plan = ExhaustivePlan.of(space, shape, {"mode": MODES})
    # 4 modes x BLOCK 16..64 (BLOCK <= n): 12 valid of 4 x 6 points
    assert (len(plan.configs), plan.points) == (12, 24)
    assert set(plan.configs) == {Config(mode=m, BLOCK=b) for m in MODES for b in (16, 32, 64)}

    # A first run stopped after 5 measurements (a budget standing in for Ctrl-C) ...
    ctx = open_study(NAME, shape, store=store, measurer=measurer, sampler=ExhaustiveSampler(plan.configs), warm=False)
    first = run_trials(ctx, CountBudget(5))
    assert [r.config for r in first] == list(plan.configs[:5])
    # ... and a trial asked but never measured (a run killed outright): its config is handed out again.
    ctx.study.ask()
    summaries = tune_shapes(NAME, [("n64", shape)], store=store, measurer=measurer, trials=1,
                            exhaustive=True, only={"mode": MODES}, comparators=False)
    second = summaries[0].trials
    assert [r.config for r in second] == list(plan.configs[5:])
    assert all(r.duplicate_of is None for r in second)
    rows = _trial_rows(store, ctx.study_id)
    assert sorted(r.config_json for r in rows) == sorted(c.to_json() for c in plan.configs)  # once each
    statuses = {Config.from_json(r.config_json)["mode"]: r.status for r in rows}
    assert statuses == {"ok": Status.OK, "wrong": Status.WRONG_RESULT, "compile_error": Status.COMPILE_ERROR,
                        "raise": Status.RUNTIME_ERROR}
    # The final round published the fastest verified config of the sweep.
    assert summaries[0].final.winner is not None and summaries[0].final.winner.result.config["mode"] == "ok"

    # Running it again measures nothing; widening the subspace measures only the new configs.
    again = tune_shapes(NAME, [("n64", shape)], store=store, measurer=measurer, trials=1, exhaustive=True,
                        only={"mode": MODES}, comparators=False, finalists=1)
    assert again[0].trials == ()
    wider = tune_shapes(NAME, [("n64", shape)], store=store, measurer=measurer, trials=1, exhaustive=True,
                        only={"mode": (*MODES, "nan")}, comparators=False, finalists=1)
    assert sorted(r.config.to_json() for r in wider[0].trials) == sorted(
        Config(mode="nan", BLOCK=b).to_json() for b in (16, 32, 64))
    assert len(measured_configs(store, ctx.study_id)) == 15


def test_queued_configs_are_measured_and_not_handed_out_twice(tmp_path: Path, measurer: Measurer) -> None:
    """A config queued by an earlier (TPE) run of the same key is popped first; the exhaustive sampler skips it."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    shape = Shape(n=64)
    tpe = open_study(NAME, shape, store=store, measurer=measurer, sampler="tpe", seed=0)  # queues the default
    queued = tpe.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in queued] == [{"mode": "ok", "BLOCK": 64}]
    summaries = tune_shapes(NAME, [("n64", shape)], store=store, measurer=measurer, trials=1, exhaustive=True,
                            only={"mode": ("ok",)}, comparators=False, finalists=1)
    records = summaries[0].trials
    assert records[0].config == Config(mode="ok", BLOCK=64)
    assert sorted(r.config["BLOCK"] for r in records) == [16, 32, 64]
    assert all(r.status is Status.OK and r.duplicate_of is None for r in records)


def test_parse_only_types_values_by_the_domain_and_names_mistakes() -> None:
    registry.register(NAME, TUNABLE_REF)
    space = registry.get(NAME).space()
    assert parse_only(["mode=ok,nan", "BLOCK=32"], space) == {"mode": ("ok", "nan"), "BLOCK": (32,)}
    for bad, message in [("mode", "expected NAME=VALUE"), ("BLOCK=24", "'24' is not one of 16, 32"),
                         ("colour=red", "unknown parameter 'colour'")]:
        with pytest.raises(UserInputError, match=message):
            parse_only([bad], space)


def test_the_cli_prints_the_count_up_front_and_dry_run_measures_nothing(tmp_path: Path) -> None:
    url = db.sqlite_url(tmp_path / "cli.db")
    result = CliRunner().invoke(app, [
        "tune", "mamba2_chunk_cumsum", "--shape", "B=1,S=512,H=4", "--exhaustive", "--dry-run", "--db", url,
        "--only", "layout=rows", "--only", "hints=false", "--only", "persistent=0", "--only", "num_stages=1",
        "--only", "SPLIT=1",
    ])
    assert result.exit_code == 0, result.output
    assert "37 valid configs of 320 points (subspace layout∈{rows}, hints∈{false}" in result.output
    assert not (tmp_path / "cli.db").exists()
    result = CliRunner().invoke(app, ["tune", "mamba2_chunk_cumsum", "--shape", "B=1,S=512,H=4", "--only", "SPLIT=1"])
    assert result.exit_code == 2 and "--only and --dry-run go with --exhaustive" in result.output
