"""Nearest-shape regret over a small real store (SQLite and PostgreSQL): leave-one-out, timed from records."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest

from tests.fixtures.fault_templates import TUNABLE_REF
from tests.fixtures.processes import ROOT, env
from tests.fixtures.servers import TOKENS, publish, thread_server
from tuner import db, registry
from tuner.api.settings import ApiSettings
from tuner.distance import DEFAULT_DISTANCE, ShapeDistance
from tuner.frozen import Config, Shape
from tuner.keys import StudyKey
from tuner.measure.devices.base import Fingerprint
from tuner.service.regret import leave_one_out, quantile, recorded_shapes, regret_reports

NAME = "toy_regret"
TUNABLE = "fault_vector_scale_tunable"
A, B, C, D, E = ({"BLOCK": b} for b in (16, 32, 128, 64, 8))


@pytest.fixture
def store(db_url: str) -> Iterator[db.Store]:
    with db.Store.open(db_url) as store:
        yield store


def _study(store: db.Store, n: int, *, trials: Mapping[str, float], final: Mapping[str, float],
           best: str, default: str | None = None) -> None:
    """A study of shape n: trial measurements, one final round (``default`` measured as the default
    candidate), and its best published from the final round (or from the trials if there is none)."""
    configs = {"A": A, "B": B, "C": C, "D": D, "E": E}
    shape = Shape({"n": n})
    fingerprint = Fingerprint(kind="cpu", device_name="test-cpu", driver="t")
    key = StudyKey.of(NAME, "1", shape, fingerprint)
    with store.session() as session:
        study = db.get_or_create_study(
            session, name=key.study_name(), template=NAME, template_version="1", shape_key=key.shape_key,
            shape_json=shape.to_json(), device_kind="cpu", device_name="test-cpu",
            fingerprint_hash=key.fingerprint_hash, fingerprint_json=fingerprint.to_json())

        def add(role: str, name: str, us: float, candidate: str = "config") -> int:
            return db.add_measurement(
                session, study_id=study.id, role=role, candidate=candidate, round_id="r1" if role == "final" else None,
                config_json=Config(configs[name]).to_json(), status="OK", median_us=us, n_samples=5).id

        ids = {name: add("trial", name, us) for name, us in trials.items()}
        ids.update({name: add("final", name, us, "default" if name == default else "config")
                    for name, us in final.items()})
        # A failed measurement and a comparator never count.
        db.add_measurement(session, study_id=study.id, role="trial", candidate="config", status="WRONG_RESULT",
                           config_json=Config(C).to_json(), reason="bad")
        db.add_measurement(session, study_id=study.id, role="final", candidate="comparator:lib", status="OK",
                           round_id="r1", config_json={"comparator": "lib"}, median_us=0.1)
        db.publish_best(session, study_id=study.id, measurement_id=ids[best])


def _valid(config: Mapping[str, Any], shape: Mapping[str, Any]) -> bool:
    return bool(config["BLOCK"] <= shape["n"])


def test_leave_one_out_times_the_served_config_from_the_held_out_shapes_records(store: db.Store) -> None:
    _study(store, 256, trials={"A": 1.05, "B": 1.2}, final={"A": 1.0, "B": 1.1, "D": 1.5}, best="A", default="D")
    _study(store, 512, trials={"A": 2.4, "B": 2.1}, final={"B": 2.0}, best="B")
    _study(store, 4096, trials={"B": 6.0, "C": 5.2}, final={"C": 5.0}, best="C")
    _study(store, 64, trials={"A": 0.5}, final={}, best="A")  # no final round: its best is a trial
    _study(store, 8192, trials={"E": 9.0}, final={"E": 8.0}, best="E")  # never measured C
    shapes = recorded_shapes(store, template=NAME)
    assert len(shapes) == 5
    rows = {r.shape["n"]: r for r in leave_one_out(shapes, default=D, valid=_valid)}
    # 256 → nearest 512 (distance 1; 64 is at 2): B, re-measured in 256's final round: 1.1 / 1.0.
    assert rows[256].match == "nearest" and rows[256].source_shape == {"n": 512} and rows[256].config == B
    assert rows[256].basis == "final round" and rows[256].regret == pytest.approx(0.1)
    # 512 → nearest 256: A, only a trial on 512: trial medians 2.4 / 2.1 (B's own trial, not its final 2.0).
    assert (rows[512].config, rows[512].basis) == (A, "trials") and rows[512].regret == pytest.approx(2.4 / 2.1 - 1)
    # 4096 → 8192 (distance 1) serves E: never measured for 4096: unmeasured, not guessed.
    assert rows[4096].config == E and rows[4096].regret is None and rows[4096].basis is None
    # 64 → 256 serves A, 64's own best: no regret.
    assert (rows[64].config, rows[64].regret, rows[64].basis) == (A, 0.0, "own best")
    # 8192 → 4096 serves C (BLOCK 128 <= 8192): not measured on 8192 either.
    assert rows[8192].config == C and rows[8192].regret is None
    report = regret_reports(shapes, space_of=lambda v: (D, _valid, ()) if v == "1" else None)[0]
    assert (report.template, report.template_version, report.device_name) == (NAME, "1", "test-cpu")
    assert report.unmeasured == 2 and report.measured == pytest.approx([0.0, 0.1, 2.4 / 2.1 - 1])
    assert report.median() == pytest.approx(0.1) and report.to_dict()["shapes"] == 5


def test_the_default_is_served_and_timed_when_no_entry_fits(store: db.Store) -> None:
    _study(store, 256, trials={}, final={"A": 1.0, "D": 1.5}, best="A", default="D")
    _study(store, 16, trials={}, final={"E": 0.2}, best="E")
    shapes = recorded_shapes(store, template=NAME)
    # Without the 256 entry, only 16's config E is left, and the constraint keeps it (8 <= 256), but it is 4
    # doublings away and its study never timed the default (no gain to weigh): beyond the lookup's
    # NEAR_DISTANCE (3) it is not served, the default is, timed from the final round.
    rows = {r.shape["n"]: r for r in leave_one_out(shapes, default=D, valid=_valid)}
    assert rows[256].match == "default" and rows[256].config == D and rows[256].regret == pytest.approx(0.5)
    # With no near distance (as leave_one_out and regret_reports pass it on), E is served: never measured on
    # 256, so unmeasured, not guessed.
    rows = {r.shape["n"]: r for r in leave_one_out(shapes, default=D, valid=_valid, near_distance=math.inf)}
    assert (rows[256].match, rows[256].config, rows[256].regret) == ("nearest", E, None)
    report = regret_reports(shapes, space_of=lambda v: (D, _valid, ()), near_distance=math.inf)[0]
    assert {r.shape["n"]: r.config for r in report.rows}[256] == E
    # So it is when the distance makes the shapes incomparable.
    apart = ShapeDistance("int dims must match", weights={"n": math.inf})
    rows = {r.shape["n"]: r for r in leave_one_out(shapes, default=None, valid=_valid, distance=apart)}
    assert rows[256].match == "default" and rows[256].config == D and rows[256].regret == pytest.approx(0.5)
    assert rows[16].match == "none" and rows[16].regret is None  # no default recorded for 16, none given


def test_quantiles_interpolate_between_order_statistics() -> None:
    assert quantile([], 0.5) is None
    assert quantile([3.0], 0.9) == 3.0
    assert quantile([0.0, 1.0, 2.0, 10.0], 0.5) == 1.5
    assert quantile(list(map(float, range(11))), 0.9) == pytest.approx(9.0)


def test_the_regret_is_served_over_http(store: db.Store) -> None:
    registry.register(TUNABLE, TUNABLE_REF)
    publish(store, TUNABLE, {"n": 1024}, {"mode": "ok", "BLOCK": 512}, 10.0)
    publish(store, TUNABLE, {"n": 2048}, {"mode": "ok", "BLOCK": 256}, 12.0)
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    with thread_server(settings, store) as base:
        (report,) = httpx.get(f"{base}/v1/templates/{TUNABLE}/regret", params={"device": "cpu"}).json()
        assert (report["template_version"], report["device_name"], report["shapes"]) == ("1", "test-cpu", 2)
        # Each study measured only its own best: the neighbour's config is unmeasured, not guessed.
        assert report["unmeasured"] == 2 and report["median"] is None and report["distance"] == DEFAULT_DISTANCE.name
        rows = {r["shape"]["n"]: r for r in report["rows"]}
        assert rows[1024]["config"] == {"mode": "ok", "BLOCK": 256} and rows[1024]["source_shape"] == {"n": 2048}
        assert httpx.get(f"{base}/v1/templates/{TUNABLE}/regret", params={"device": "cuda"}).json() == []
        assert httpx.get(f"{base}/v1/templates/nope/regret").status_code == 404


@pytest.mark.slow
def test_tuner_regret_prints_markdown_and_json(store: db.Store) -> None:
    publish(store, TUNABLE, {"n": 1024}, {"mode": "ok", "BLOCK": 512}, 10.0)
    publish(store, TUNABLE, {"n": 2048}, {"mode": "ok", "BLOCK": 256}, 12.0)

    def tuner(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tuner.cli", *args, "--db", store.unmasked_url()],
                              capture_output=True, text=True, env=env(), cwd=ROOT, timeout=300)

    text = tuner("regret", TUNABLE)
    assert text.returncode == 0, text.stderr
    assert f"## Nearest-shape regret: {TUNABLE} v1 on test-cpu" in text.stdout
    assert "| n=1024 | nearest | n=2048 | 1 | 10.000 | — | unmeasured |" in text.stdout
    (report,) = json.loads(tuner("regret", TUNABLE, "--json", "--distance", "log2").stdout)
    assert report["distance"] == "log2" and report["unmeasured"] == 2
    bad = tuner("regret", TUNABLE, "--distance", "nope")
    assert bad.returncode == 2 and "no distance 'nope'" in bad.stderr
    full = tuner("report", TUNABLE, "--regret")
    assert full.returncode == 0 and "Nearest-shape regret" in full.stdout


@pytest.mark.slow
def test_tuner_regret_measure_times_the_served_configs_the_records_lack(store: db.Store) -> None:
    from tuner.measure.devices.cpu import cpu_model_name

    here = cpu_model_name()
    # Each shape measured only its own best: every served config is unmeasured in the records.
    publish(store, TUNABLE, {"n": 1024}, {"mode": "ok", "BLOCK": 512}, 10.0, device_name=here)
    publish(store, TUNABLE, {"n": 2048}, {"mode": "ok", "BLOCK": 256}, 12.0, device_name=here)
    publish(store, TUNABLE, {"n": 8192}, {"mode": "wrong", "BLOCK": 128}, 14.0, device_name=here)
    publish(store, TUNABLE, {"n": 1024}, {"mode": "ok", "BLOCK": 64}, 10.0, device_name="another-cpu")
    publish(store, TUNABLE, {"n": 2048}, {"mode": "ok", "BLOCK": 32}, 12.0, device_name="another-cpu")
    run = subprocess.run([sys.executable, "-m", "tuner.cli", "regret", TUNABLE, "--json", "--measure", "--device",
                          "cpu", "--samples", "3", "--db", store.unmasked_url()],
                         capture_output=True, text=True, env=env(), cwd=ROOT, timeout=900)
    assert run.returncode == 0, run.stderr
    reports = {r["device_name"]: r for r in json.loads(run.stdout)}
    ours = {row["shape"]["n"]: row for row in reports[here]["rows"]}
    # 1024 and 2048 serve each other's configs: both measured now, beside their own best, on this CPU.
    for n in (1024, 2048):
        assert ours[n]["basis"] == "measured now" and math.isfinite(ours[n]["regret"]), ours[n]
    assert ours[1024]["config"] == {"mode": "ok", "BLOCK": 256} and ours[2048]["config"]["BLOCK"] == 512
    # 8192 is served 2048's config, but its own best computes wrong results: no figure, the row stays
    # unmeasured, and a note says why.
    assert ours[8192]["config"] == {"mode": "ok", "BLOCK": 256} and ours[8192]["regret"] is None
    notes = reports[here]["notes"]
    assert any("n=8192: not measured now (its own best WRONG_RESULT" in n for n in notes), notes
    # Records of another device are not measured here.
    theirs = reports["another-cpu"]
    assert theirs["unmeasured"] == 2 and any(f"this device is {here}" in n for n in theirs["notes"])


def test_regret_measure_compares_with_the_latest_best_of_a_shape_tuned_twice(store: db.Store) -> None:
    from tuner.measure.devices.cpu import cpu_model_name

    here = cpu_model_name()
    # 1024 tuned twice on this device: the older best computes wrong results, the later one (served,
    # held out) is right. --measure must time the served config against the later one.
    publish(store, TUNABLE, {"n": 1024}, {"mode": "wrong", "BLOCK": 64}, 10.0, device_name=here,
            libraries={"triton": "3.4"})
    publish(store, TUNABLE, {"n": 1024}, {"mode": "ok", "BLOCK": 128}, 9.0, device_name=here,
            libraries={"triton": "3.5"})
    publish(store, TUNABLE, {"n": 2048}, {"mode": "ok", "BLOCK": 256}, 12.0, device_name=here)
    run = subprocess.run([sys.executable, "-m", "tuner.cli", "regret", TUNABLE, "--json", "--measure", "--device",
                          "cpu", "--samples", "3", "--db", store.unmasked_url()],
                         capture_output=True, text=True, env=env(), cwd=ROOT, timeout=900)
    assert run.returncode == 0, run.stderr
    report = next(r for r in json.loads(run.stdout) if r["device_name"] == here)
    row = next(r for r in report["rows"] if r["shape"]["n"] == 1024)
    assert row["config"] == {"mode": "ok", "BLOCK": 256} and row["best_us"] == 9.0
    assert row["basis"] == "measured now" and math.isfinite(row["regret"]), (row, report["notes"])


def test_regret_measure_says_how_many_were_measured_and_how_many_failed(store: db.Store) -> None:
    from tuner.measure.devices.base import DeviceSpec
    from tuner.measure.devices.cpu import cpu_model_name
    from tuner.measure.measurer import MeasureOptions, Measurer
    from tuner.service.regret import MEASURED_NOW, measure_unmeasured, registered_space

    registry.register(TUNABLE, TUNABLE_REF)
    here = cpu_model_name()
    # Each shape measured only its own best. 1024 and 2048 serve each other's configs (both right); 8192 is
    # served 2048's config but its own best computes wrong results: that pair fails.
    publish(store, TUNABLE, {"n": 1024}, {"mode": "ok", "BLOCK": 512}, 10.0, device_name=here)
    publish(store, TUNABLE, {"n": 2048}, {"mode": "ok", "BLOCK": 256}, 12.0, device_name=here)
    publish(store, TUNABLE, {"n": 8192}, {"mode": "wrong", "BLOCK": 128}, 14.0, device_name=here)
    shapes = recorded_shapes(store, template=TUNABLE)
    (report,) = regret_reports(shapes, space_of=registered_space(TUNABLE))
    assert report.unmeasured == 3
    with Measurer(DeviceSpec("cpu"), MeasureOptions(n_samples=2, warmup=1, timeout_s=60)) as measurer:
        (measured,) = measure_unmeasured([report], shapes, measurer, version="1")
    rows = {r.shape["n"]: r for r in measured.rows}
    assert [n for n, r in sorted(rows.items()) if r.basis == MEASURED_NOW] == [1024, 2048]
    assert rows[8192].regret is None and rows[8192].basis is None
    # The summary counts the pairs measured and the pairs that failed, with their statuses; it does not say
    # that the failed one was measured.
    summary = [n for n in measured.notes if "served config(s) the records lacked" in n]
    assert summary == [f"3 served config(s) the records lacked tried on {here}, each interleaved with the shape's "
                       "own best: 2 measured OK, 1 failed (WRONG_RESULT: 1) and stays unmeasured"], measured.notes
    assert any(n.startswith("n=8192: not measured now (its own best WRONG_RESULT") for n in measured.notes)


def test_a_shape_with_bests_of_two_fingerprints_is_held_out_once_with_all_its_entries(store: db.Store) -> None:
    # 1024 was tuned twice, under two software versions: two bests of one shape (the later one is served).
    publish(store, TUNABLE, {"n": 1024}, {"mode": "ok", "BLOCK": 64}, 10.0, libraries={"triton": "3.4"})
    publish(store, TUNABLE, {"n": 1024}, {"mode": "ok", "BLOCK": 128}, 9.0, libraries={"triton": "3.5"})
    publish(store, TUNABLE, {"n": 2048}, {"mode": "ok", "BLOCK": 256}, 12.0)
    shapes = recorded_shapes(store, template=TUNABLE)
    assert len(shapes) == 3
    rows = leave_one_out(shapes)
    assert sorted(r.shape["n"] for r in rows) == [1024, 2048]
    held = next(r for r in rows if r.shape["n"] == 1024)
    # Not the other 1024 entry ("exact", distance 0): the shape is missing, so 2048's config is served.
    assert held.match == "nearest" and held.source_shape == {"n": 2048} and held.best_us == 9.0
    served = next(r for r in rows if r.shape["n"] == 2048)
    assert served.config == {"mode": "ok", "BLOCK": 128}  # the later 1024 best
