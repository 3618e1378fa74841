"""``tuner verify`` on the CPU: a published best re-measured in fresh processes, the drift against the store
flagged and recorded; as a job a worker runs; in the API answer and the report.

The templates (tests/fixtures/drift_templates.py) spin for a time set per measurement process: the tune that
publishes runs in the first process, each verification process is a new one. ``drifting_spin`` runs three
times as long in every process after the first; ``steady_spin`` keeps its speed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from markupsafe import escape

from tests.fixtures.drift_templates import (
    DIR_ENV,
    DRIFTING_REF,
    FLAKIER_REF,
    FLAKY_ALONE_REF,
    FLAKY_REF,
    STEADY_REF,
)
from tests.fixtures.fault_templates import NEAR_BOUND_REF, input_fraction
from tests.fixtures.processes import ROOT, env
from tests.fixtures.servers import SUBMIT, TOKENS, auth, publish, thread_server
from tuner import db, registry
from tuner.api.settings import ApiSettings
from tuner.driver.reverify import (
    BEST_LABEL,
    CandidateFigures,
    _disprove,
    _published_best,
    disproval_text,
    verify_best,
    verify_served,
)
from tuner.driver.study import FINAL_NEAR_BOUND, VERIFY_NEAR_BOUND
from tuner.driver.tuning import tune_shapes
from tuner.errors import UserInputError
from tuner.frozen import Config, Shape
from tuner.keys import Fingerprint, software_of
from tuner.lookup import Requester, choose, requester_software, verification_note
from tuner.measure.devices.base import DeviceSpec
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.report.markdown import collect, render_markdown, render_verifications
from tuner.results import MeasureResult, SampleSummary, Status
from tuner.service.worker import Worker, WorkerOptions
from tuner.store import Disproval, NewMeasurement
from tuner.store.entries import disproved_in, published_entries
from tuner.store.memory import MemoryStore

CPU = DeviceSpec("cpu")
OPTIONS = MeasureOptions(n_samples=15, warmup=2)
SHAPE = Shape(n=64)


@pytest.fixture(autouse=True)
def _spin_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "ordinals"
    folder.mkdir()
    monkeypatch.setenv(DIR_ENV, str(folder))  # inherited by the measurement processes
    registry.register("drifting_spin", DRIFTING_REF)
    registry.register("steady_spin", STEADY_REF)
    registry.register("flaky_spin", FLAKY_REF)
    registry.register("flaky_alone", FLAKY_ALONE_REF)
    registry.register("flakier_spin", FLAKIER_REF)


def _publish(store: db.Store, name: str) -> None:
    """Tune the one-config space in one measurement process (the first): its final round publishes."""
    with Measurer(CPU, OPTIONS) as measurer:
        (summary,) = tune_shapes(name, [("n=64", SHAPE)], store=store, measurer=measurer, trials=1)
    assert summary.final.published


def test_a_template_whose_speed_changes_between_processes_is_flagged(db_url: str) -> None:
    store = db.Store.open(db_url)
    _publish(store, "drifting_spin")
    seen: list[int] = []
    outcome = verify_best(store, "drifting_spin", SHAPE, device=CPU, processes=2, options=OPTIONS,
                          on_process=lambda p: seen.append(p.process))
    v = outcome.verdict
    assert seen == [1, 2] and len(outcome.processes) == 2
    assert v.flagged and v.drift is not None and v.drift > 0.5  # three times as slow: about +200%
    assert v.low_us is not None and v.high_us is not None and v.low_us <= v.median_us <= v.high_us  # type: ignore[operator]
    for process in outcome.processes:
        best = process.best
        assert best.status == "OK" and best.ratio is not None and best.ratio > 1.5
        assert best.p20_us is not None and best.p20_us <= best.median_us <= best.p80_us  # type: ignore[operator]
        (library,) = [c for c in process.candidates if c.label != BEST_LABEL]
        # the comparator returns its own output and does not drift: its ratio to its stored figure stays near 1
        assert library.label == "comparator:library" and library.status == "OK"
        assert library.ratio is not None and 0.4 < library.ratio < 2.5
    (record,) = store.list_verifications(template="drifting_spin")
    best = store.get_best(template="drifting_spin", shape_key=SHAPE.key())
    assert best is not None and record.study_id == best.study_id and record.config == best.config
    assert record.flagged and record.processes == 2 and record.stored_us == best.median_us
    assert record.drift == pytest.approx(v.drift) and record.fingerprint_hash == outcome.fingerprint.hash()
    assert [p["process"] for p in record.figures] == [1, 2]
    # the published best itself is left as it was: a re-tune decides
    assert best.median_us == outcome.best.median_us


def test_a_steady_template_is_within_tolerance(tmp_path: Path) -> None:
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    _publish(store, "steady_spin")
    before = render_verifications([collect(store, "steady_spin")])
    assert "Served bests not yet re-measured by `tuner verify` (1): steady_spin n=64" in before, before
    assert "No verification recorded" in before
    outcome = verify_best(store, "steady_spin", SHAPE, device=CPU, processes=2, options=OPTIONS, tolerance=0.5,
                          comparators=False)
    assert not outcome.verdict.flagged and abs(outcome.verdict.drift or 1.0) < 0.5
    assert all(len(p.candidates) == 1 for p in outcome.processes)  # no comparator asked for
    report = collect(store, "steady_spin")
    assert "⚠" not in render_markdown(report)
    text = render_verifications([report])
    assert "| steady_spin | n=64 |" in text and "| ok (±50%) |" in text and "not yet re-measured" not in text


def test_a_processs_figures_keep_the_kernel_split_that_names_what_drifted() -> None:
    # CUPTI results carry per-kernel medians (the CPU backend's carry none): a verification keeps them per
    # process, so a drifting total says which kernel moved (2026-12-04: one of six MIMO kernels).
    timed = MeasureResult(Status.OK, Config(scale=1), SampleSummary.of([10.0, 11.0, 12.0]),
                          kernels={"walk": 4.0, "values": 7.0})
    figures = CandidateFigures.of(BEST_LABEL, timed, stored_us=10.0)
    assert figures.to_dict()["kernels"] == {"walk": 4.0, "values": 7.0}
    assert figures.ratio == pytest.approx(1.1)
    untimed = CandidateFigures.of(BEST_LABEL, MeasureResult(Status.OK, Config(scale=1),
                                                            SampleSummary.of([10.0])), 10.0)
    assert "kernels" not in untimed.to_dict()  # figures of backends without a split stay as they were


def test_comparators_can_be_limited_to_the_first_processes(tmp_path: Path) -> None:
    """A comparator that compiles for minutes in each new process is re-measured in the first process only;
    the best config is still re-measured in every process and the verdict is on all of them."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    _publish(store, "steady_spin")
    outcome = verify_best(store, "steady_spin", SHAPE, device=CPU, processes=2, comparator_processes=1,
                          options=OPTIONS, tolerance=0.5)
    first, second = outcome.processes
    assert [c.label for c in first.candidates] == [BEST_LABEL, "comparator:library"]
    assert [c.label for c in second.candidates] == [BEST_LABEL]
    assert all(p.best.status == "OK" for p in outcome.processes) and not outcome.verdict.flagged
    text = render_verifications([collect(store, "steady_spin")])
    # the comparator's ratio to its stored figure, and its speed-up over the best in the same process: both from
    # the one process that measured it
    assert re.search(r"library \d\.\d{3} \|", text) and re.search(r"library \d+\.\d\dx \(1\) \|", text)
    with pytest.raises(UserInputError, match="--comparator-processes must be between 1 and --processes"):
        verify_best(store, "steady_spin", SHAPE, device=CPU, processes=2, comparator_processes=3, options=OPTIONS)
    # without comparators the limit limits nothing: the verification runs, the best alone in each process
    alone = verify_best(store, "steady_spin", SHAPE, device=CPU, processes=1, comparators=False,
                        comparator_processes=3, options=OPTIONS, tolerance=0.5)
    assert [[c.label for c in p.candidates] for p in alone.processes] == [[BEST_LABEL]]


def _served(store: db.Store, template: str, shape: dict[str, int], host: Fingerprint, backend: str) -> int | None:
    """The measurement GET /v1/best serves for the shape to a client on ``host`` (entries of that shape only)."""
    entries = [e for r, e in published_entries(store, template=template, device_kind=host.kind, version="1")
               if r.shape_key == Shape(shape).key()]
    software = requester_software(host.kind, software_of(host.to_json()) or {})
    answer = choose(shape, entries, default=None, requester=Requester(host.device_name, software, "1", backend))
    assert answer is not None and answer.entry is not None
    return answer.entry.measurement_id


def test_verify_picks_the_best_the_lookup_serves_this_host(db_url: str) -> None:
    """The best re-measured is the one the lookup serves the re-measuring host among the shape's bests: its
    device name first, then its software as a client sends it and the lookup compares it (a Triton template
    ignores tilelang, a TileLang one does not; python is not compared; off CUDA neither the driver nor the
    runtime), then the most recently published."""
    store = db.Store.open(db_url)
    libs = {"python": "3.12.3", "torch": "2.11.0", "triton": "3.6.0", "tilelang": "0.1.8"}
    shape = {"n": 64}

    def put(config: int, *, kind: str = "cuda", name: str = "H200", **changed: str) -> db.BestRecord:
        return publish(store, "picky", shape, {"x": config}, 10.0 - config, device_kind=kind, device_name=name,
                       libraries={**libs, **changed})

    old = put(1)
    other_tilelang = put(2, tilelang="0.1.15")
    put(3, torch="2.10.0")  # newer, but another torch
    put(4, name="H100")  # newest, another device name
    host = Fingerprint(kind="cuda", device_name="H200", driver="test", libraries=libs)
    for backend, expected in (("triton", other_tilelang), ("tilelang", old)):
        chosen = _published_best(store, "picky", "1", backend, Shape(shape), host)
        assert chosen.id == expected.id and chosen.measurement_id == _served(store, "picky", shape, host, backend)
    newer_python = put(5, python="3.11.9")  # python is not compared: this one is now the newest match
    chosen = _published_best(store, "picky", "1", "triton", Shape(shape), host)
    assert chosen.id == newer_python.id and chosen.measurement_id == _served(store, "picky", shape, host, "triton")
    # an NPU host: its driver and runtime are not compared; torch is
    npu_torch = put(6, kind="npu", name="910B")
    put(7, kind="npu", name="910B", torch="2.10.0")
    npu = Fingerprint(kind="npu", device_name="910B", driver="other", runtime="8.0", libraries=libs)
    chosen = _published_best(store, "picky", "1", "triton", Shape(shape), npu)
    assert chosen.id == npu_torch.id and chosen.measurement_id == _served(store, "picky", shape, npu, "triton")
    with pytest.raises(UserInputError, match="no best config of picky@2"):
        _published_best(store, "picky", "2", "triton", Shape(shape), host)


def test_a_verification_speaks_only_for_the_config_it_re_measured(db_url: str) -> None:
    """A study's latest verification is of the best published when it ran: once a later sweep of the same
    study publishes another best, the answer (and the pages and report, through ``of_config``) carry none."""
    store = db.Store.open(db_url)
    first = publish(store, "picky", {"n": 64}, {"x": 1}, 10.0, device_kind="cuda", device_name="H200")
    check = store.add_verification(
        study_id=first.study_id, config_json=first.config_json, stored_us=10.0, median_us=10.1, low_us=10.0,
        high_us=10.2, drift=0.01, tolerance=0.03, flagged=False, processes=2, figures=[], device_kind="cuda",
        device_name="H200", fingerprint_hash=first.fingerprint_hash, fingerprint_json="{}")
    (entry,) = [e for _, e in published_entries(store, template="picky")]
    assert entry.verification is not None and entry.verification["drift"] == pytest.approx(0.01)
    second = publish(store, "picky", {"n": 64}, {"x": 2}, 8.0, device_kind="cuda", device_name="H200")
    assert second.study_id == first.study_id  # the same key: the same study, a new best
    newest = max(published_entries(store, template="picky"), key=lambda pair: pair[0].id)[1]
    assert newest.config == {"x": 2} and newest.verification is None
    assert check.of_config({"x": 1}) is check and check.of_config('{"x": 2}') is None and check.of_config(None) is None


def _publish_all(store: db.Store, name: str) -> None:
    """Measure every config of the space in the first measurement process; its final round publishes."""
    with Measurer(CPU, OPTIONS) as measurer:
        (summary,) = tune_shapes(name, [("n=64", SHAPE)], store=store, measurer=measurer, trials=3,
                                 exhaustive=True, comparators=False)
    assert summary.final.published


def test_a_best_that_gives_wrong_results_on_fresh_inputs_is_replaced_by_the_next_of_its_round(db_url: str) -> None:
    """The tune's process publishes scale 1 (the fastest, right there); in fresh processes it is 2% off: the
    verification disproves it, the next fastest config of the round that published it (right, verified on
    that round's inputs) is published with that round's figure, and later rounds leave scale 1 out."""
    store = db.Store.open(db_url)
    _publish_all(store, "flaky_spin")
    first = store.get_best(template="flaky_spin", shape_key=SHAPE.key())
    assert first is not None and first.config == {"scale": 1}
    outcome = verify_best(store, "flaky_spin", SHAPE, device=CPU, processes=2, options=OPTIONS, comparators=False)
    assert outcome.verdict.wrong == 2 and outcome.verdict.flagged and outcome.verdict.median_us is None
    assert all(p.best.status == "WRONG_RESULT" and "relative" in (p.best.reason or "") for p in outcome.processes)
    assert outcome.record.wrong_processes == 2 and outcome.record.flagged
    replacement = outcome.replacement
    assert replacement is not None and not outcome.withdrawn and replacement.config == {"scale": 2}
    served = store.get_best(template="flaky_spin", shape_key=SHAPE.key())
    assert served == replacement and served.study_id == first.study_id
    assert served.published_at == first.published_at  # a stand-in is not "newer" for the lookup's ties
    round_rows = store.list_measurements(study_id=first.study_id, role="final")
    (figure,) = [m for m in round_rows if m.id == replacement.measurement_id]
    assert figure.round_id == store.get_measurement(measurement_id=first.measurement_id).round_id  # type: ignore[union-attr]
    assert replacement.median_us == figure.median_us
    assert [c.to_dict() for c in disproved_in(store, first.study_id)] == [{"scale": 1}]
    assert "published in its place: {\"scale\":2}" in disproval_text(outcome)
    (row,) = collect(store, "flaky_spin").rows  # the report shows the config served, from the same round
    assert row.best_config == {"scale": 2} and row.best_us == replacement.median_us
    # the new best verifies; a verification of it says nothing about the disproved one
    again = verify_best(store, "flaky_spin", SHAPE, device=CPU, processes=1, options=OPTIONS, comparators=False,
                        tolerance=0.5)
    assert again.best.config == {"scale": 2} and not again.verdict.flagged and again.replacement is None
    # a later tune's final round does not bring the disproved config back
    with Measurer(CPU, OPTIONS) as measurer:
        (summary,) = tune_shapes("flaky_spin", [("n=64", SHAPE)], store=store, measurer=measurer, trials=1,
                                 comparators=False)
    assert {"scale": 1} not in [e.result.config.to_dict() for e in summary.final.entries if e.result.config]
    assert store.get_best(template="flaky_spin", shape_key=SHAPE.key()).config == {"scale": 2}  # type: ignore[union-attr]


class _RoundMeanwhile(MemoryStore):
    """A memory store on which a final round publishes ``republish`` the first time a disproval is recorded,
    just before it (the round read the disproved configs before this verification was recorded)."""

    republish: int | None = None

    def record_disproval(self, **fields: Any) -> Disproval | None:
        if self.republish is not None:
            self.publish_best(study_id=fields["study_id"], measurement_id=self.republish)
            self.republish = None
        return super().record_disproval(**fields)


def test_a_disproval_decides_again_when_a_final_round_published_the_config_meanwhile() -> None:
    """The verification disproves {"scale": 1}; while it was decided, a new final round published scale 1
    again (its own measurement): the write finds another best than the one decided on, stores nothing, and
    the next decision, on the new round, publishes that round's next config, with one verification stored."""
    store = _RoundMeanwhile()
    study = store.get_or_create_study(
        name="s", template="flaky_spin", template_version="1", shape_key=SHAPE.key(), shape_json=SHAPE.to_json(),
        device_kind="cpu", device_name="test-cpu", fingerprint_hash="f", fingerprint_json="{}")

    def final(round_id: str, scale: int, median_us: float) -> int:
        return store.record_measurement(NewMeasurement(
            study_id=study.id, role="final", round_id=round_id, candidate="config", config_json={"scale": scale},
            status="OK", median_us=median_us)).id

    first, _ = final("r1", 1, 10.0), final("r1", 2, 20.0)
    again, stand_in = final("r2", 1, 11.0), final("r2", 3, 25.0)
    verified = store.publish_best(study_id=study.id, measurement_id=first)
    store.republish = again
    figures = [{"process": 1, "candidates": [{"label": BEST_LABEL, "status": "WRONG_RESULT"}]}]
    done = _disprove(store, verified, dict(
        study_id=study.id, config_json=verified.config_json, stored_us=10.0, median_us=None, low_us=None,
        high_us=None, drift=None, tolerance=0.03, flagged=True, processes=1, figures=figures, device_kind="cpu",
        device_name="test-cpu", fingerprint_hash="f", fingerprint_json="{}"))
    assert done.replacement is not None and done.replacement.measurement_id == stand_in
    assert done.replacement.published_at > verified.published_at  # the time of the best it replaced: r2's
    assert store.get_study_best(study_id=study.id) == done.replacement
    assert store.list_verifications(study_id=study.id) == [done.verification]


def test_a_wrong_best_with_no_stand_in_is_withdrawn_and_the_cli_says_so(tmp_path: Path) -> None:
    """Its round held no other config: the best is withdrawn (the lookup then serves the shape as untuned);
    ``tuner verify`` prints what happened and exits 3."""
    url = db.sqlite_url(tmp_path / "t.db")
    store = db.Store.open(url)
    _publish_all(store, "flaky_alone")
    ran = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "verify", "flaky_alone", "--shape", "n=64", "--device", "cpu",
         "--processes", "1", "--samples", "5", "--no-comparators", "--db", url, "--json"],
        capture_output=True, text=True, env={**env(), "TUNER_TEMPLATES": f"flaky_alone={FLAKY_ALONE_REF}"}, cwd=ROOT,
        timeout=300,
    )
    assert ran.returncode == 3, ran.stderr
    printed = json.loads(ran.stdout.strip().splitlines()[-1])
    assert printed["wrong_processes"] == 1 and printed["withdrawn"] and printed["replacement"] is None
    assert store.get_best(template="flaky_alone", shape_key=SHAPE.key()) is None
    assert store.list_verifications(template="flaky_alone")[0].wrong_processes == 1


def test_verify_goes_on_to_the_stand_in_until_one_stands_or_its_limit(tmp_path: Path) -> None:
    """flakier_spin's round publishes scale 1; fresh processes find scales 1 and 2 wrong. ``tuner verify
    --stand-ins 1`` verifies the best and one stand-in (both disproved, one JSON line each, exit 3) and leaves
    scale 3 served unverified, and says so; a second run verifies scale 3 and stops there (it stands)."""
    url = db.sqlite_url(tmp_path / "t.db")
    store = db.Store.open(url)
    _publish_all(store, "flakier_spin")
    ran = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "verify", "flakier_spin", "--shape", "n=64", "--device", "cpu",
         "--processes", "1", "--samples", "5", "--no-comparators", "--tolerance", "0.5", "--stand-ins", "1",
         "--db", url, "--json"],
        capture_output=True, text=True, env={**env(), "TUNER_TEMPLATES": f"flakier_spin={FLAKIER_REF}"}, cwd=ROOT,
        timeout=300,
    )
    assert ran.returncode == 3, ran.stderr
    printed = [json.loads(line) for line in ran.stdout.strip().splitlines()]
    assert [(p["config"], p["wrong_processes"], p["replacement"]["config"], p["stand_in_verified"])
            for p in printed] == [({"scale": 1}, 1, {"scale": 2}, True), ({"scale": 2}, 1, {"scale": 3}, False)]
    assert store.get_best(template="flakier_spin", shape_key=SHAPE.key()).config == {"scale": 3}  # type: ignore[union-attr]
    ((last, stand_in_next),) = verify_served(store, "flakier_spin", SHAPE, device=CPU, processes=1,
                                             options=OPTIONS, comparators=False, tolerance=0.5)
    assert stand_in_next is None and last.replacement is None  # nothing published: the chain ends here
    assert last.best.config == {"scale": 3} and not last.verdict.flagged
    newest_first = [(v.config_json, v.wrong_processes) for v in store.list_verifications(template="flakier_spin")]
    assert newest_first == [('{"scale":3}', 0), ('{"scale":2}', 1), ('{"scale":1}', 1)]
    with pytest.raises(UserInputError, match="--stand-ins"):
        next(verify_served(store, "flakier_spin", SHAPE, stand_ins=-1))


def test_only_a_wrong_result_on_the_studys_own_device_name_disproves(tmp_path: Path) -> None:
    """A host verifying a foreign best (another GPU: other numerics) flags a wrong result but disproves
    nothing: the study's own clients keep its best, and a re-tune there may publish the config again."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    best = publish(store, "picky", {"n": 64}, {"x": 1}, 10.0, device_kind="cuda", device_name="H200")
    figures = [{"process": 1, "candidates": [{"label": BEST_LABEL, "status": "WRONG_RESULT", "median_us": None}]}]

    def check(device_name: str) -> None:
        store.add_verification(
            study_id=best.study_id, config_json=best.config_json, stored_us=10.0, median_us=None, low_us=None,
            high_us=None, drift=None, tolerance=0.03, flagged=True, processes=1, figures=figures,
            device_kind="cuda", device_name=device_name, fingerprint_hash="f", fingerprint_json="{}")

    check("H100")
    assert disproved_in(store, best.study_id) == set()
    (entry,) = [e for _, e in published_entries(store, template="picky")]
    assert entry.verification is not None and entry.verification["wrong_processes"] == 1
    assert "gave wrong results in 1 of 1 fresh processes" in (verification_note(entry.verification) or "")
    check("H200")
    assert [c.to_dict() for c in disproved_in(store, best.study_id)] == [{"x": 1}]


def test_a_verify_job_that_disproves_the_best_says_so_in_its_task(tmp_path: Path) -> None:
    """A worker runs the verify job: the task ends with what the verification did, the stand-in is verified in
    turn (the task keeps that verification), and the store serves the config that stood in."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    _publish_all(store, "flaky_spin")
    job = store.create_verify_job(template="flaky_spin", template_version="1", backend="triton", device_kind="cpu",
                                  device_name=None, tasks=[("n=64", SHAPE.key(), SHAPE.to_json())], processes=1,
                                  samples=5, comparators=False)
    assert Worker(store, WorkerOptions(CPU, heartbeat_s=0.5, lease_s=10)).run(exit_when_idle=True) == 1
    done = store.get_job(job_id=job.id)
    assert done is not None and done.state == "failed"  # the config it was asked to verify did not verify
    (task,) = done.tasks
    assert task.state == "failed" and task.error is not None
    assert "wrong results in 1 of 1 fresh processes" in task.error
    assert 'published in its place: {"scale":2}' in task.error
    assert '; then {"scale":2} verified in turn: drift ' in task.error
    served = store.get_best(template="flaky_spin", shape_key=SHAPE.key())
    assert served is not None and served.config == {"scale": 2}
    second, first = store.list_verifications(template="flaky_spin")  # newest first
    assert (first.config_json, first.wrong_processes, second.config_json, second.wrong_processes) == (
        '{"scale":1}', 1, '{"scale":2}', 0)
    assert task.verification_id == second.id and task.best_config_json == '{"scale":2}'
    # the study as the pages read it shows the config served, and its round's ratios are to that config
    settings = ApiSettings(db_url=store.url, tokens=TOKENS, warm_templates=False, best_cache_ttl_s=0)  # type: ignore[call-arg]
    with thread_server(settings, store) as base, httpx.Client(base_url=base, timeout=30) as http:
        study = http.get(f"/v1/studies/{served.study_id}").json()
        page = http.get("/ui/templates/flaky_spin").text
    assert study["best_config"] == {"scale": 2}
    ratios = {json.dumps(e["config"], sort_keys=True): e["ratio"] for e in study["final_round"]
              if e["status"] == "OK"}
    assert ratios['{"scale": 2}'] == 1.0 and ratios['{"scale": 1}'] < 1.0
    assert "scale=2" in page and "scale=1</code>" not in page.split("Every study")[0]


def test_a_verify_job_says_which_stand_in_it_left_unverified(tmp_path: Path) -> None:
    """A worker allowed one stand-in (``stand_ins=1``) on flakier_spin: scale 1 disproved, its stand-in scale 2
    verified in turn and disproved too; scale 3 is served and the task says it was not verified."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    _publish_all(store, "flakier_spin")
    job = store.create_verify_job(template="flakier_spin", template_version="1", backend="triton",
                                  device_kind="cpu", device_name=None, tasks=[("n=64", SHAPE.key(), SHAPE.to_json())],
                                  processes=1, samples=5, comparators=False)
    options = WorkerOptions(CPU, heartbeat_s=0.5, lease_s=10, stand_ins=1)
    assert Worker(store, options).run(exit_when_idle=True) == 1
    done = store.get_job(job_id=job.id)
    assert done is not None and done.state == "failed"
    (task,) = done.tasks
    assert task.error is not None and task.error.count("wrong results in 1 of 1 fresh processes") == 2, task.error
    assert 'published in its place: {"scale":2}' in task.error and 'published in its place: {"scale":3}' in task.error
    assert task.error.endswith("(not verified: the stand-in limit was reached)"), task.error
    assert store.get_best(template="flakier_spin", shape_key=SHAPE.key()).config == {"scale": 3}  # type: ignore[union-attr]
    assert [v.config_json for v in store.list_verifications(template="flakier_spin")] == ['{"scale":2}', '{"scale":1}']


@pytest.mark.parametrize("wrong", ["every", "some"])
def test_a_verify_job_that_finds_a_foreign_best_wrong_flags_it_and_ends_done(
    tmp_path: Path, wrong: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A best of another device name (as the server queues for foreign answers) wrong here, in every fresh
    process or in some: the verification is flagged with its wrong processes, the job ends done (not a
    disproval: the study's clients keep their best), the worker's log says why, and so do the job's JSON and
    its page (the task keeps the verification: a done task with no figure said nothing)."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    foreign = publish(store, "flaky_spin", SHAPE.to_dict(), {"scale": 1}, 20.0, device_name="another CPU")
    if wrong == "every":  # the first process is the one measuring right: taken by no one here
        (Path(os.environ[DIR_ENV]) / "0").touch()
    job = store.create_verify_job(template="flaky_spin", template_version="1", backend="triton", device_kind="cpu",
                                  device_name=None, tasks=[("n=64", SHAPE.key(), SHAPE.to_json())], processes=2,
                                  samples=5, comparators=False)
    with caplog.at_level("WARNING", logger="tuner.service.worker"):
        assert Worker(store, WorkerOptions(CPU, heartbeat_s=0.5, lease_s=10)).run(exit_when_idle=True) == 1
    done = store.get_job(job_id=job.id)
    assert done is not None and done.state == "done" and done.error is None
    (task,) = done.tasks
    assert task.state == "done" and task.error is None
    assert (task.best_us is None) is (wrong == "every")  # a median only from the processes measuring right
    (check,) = store.list_verifications(study_id=foreign.study_id)
    assert check.flagged and check.wrong_processes == (2 if wrong == "every" else 1)
    assert check.device_name != foreign.device_name
    assert store.get_best(template="flaky_spin", shape_key=SHAPE.key()) == foreign  # left as it is
    assert disproved_in(store, foreign.study_id) == set()
    assert f"wrong results in {check.wrong_processes} of 2 fresh processes" in caplog.text
    assert "flagged; the best is left as it is there" in caplog.text
    assert task.verification_id == check.id and task.study_id == foreign.study_id
    settings = ApiSettings(db_url=store.url, tokens=TOKENS, warm_templates=False, best_cache_ttl_s=0)  # type: ignore[call-arg]
    with thread_server(settings, store) as base, httpx.Client(base_url=base, timeout=30) as http:
        served = http.get(f"/v1/jobs/{job.id}").json()
        listed = http.get("/v1/jobs").json()["items"]
        page = http.get(f"/ui/jobs/{job.id}").text
    found = served["tasks"][0]["verification"]
    assert listed[0]["tasks"][0]["verification"] == found
    assert (found["id"], found["study_id"], found["config"]) == (check.id, foreign.study_id, {"scale": 1})
    assert found["verdict"] == "wrong" and found["flagged"] and found["wrong_processes"] == check.wrong_processes
    assert found["device_name"] == check.device_name != foreign.device_name
    assert "relative" in found["reason"]
    said = f"wrong results in {check.wrong_processes} of 2 fresh processes on {check.device_name}: {found['reason']}"
    assert found["summary"] == said
    row = page.split(f'<tr data-task="{task.id}">')[1].split("</tr>")[0]
    assert f'<a href="/ui/studies/{foreign.study_id}">' in row and "scale=1" in row
    assert 'data-verdict="wrong"' in row and str(escape(said)) in row


def test_verify_without_a_published_best_says_so(tmp_path: Path) -> None:
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    with pytest.raises(UserInputError, match=r"no best config .* run `tuner tune` first"):
        verify_best(store, "steady_spin", SHAPE, device=CPU, processes=1, options=OPTIONS)


@pytest.mark.slow
def test_a_verify_job_over_http_flags_the_drift_in_the_api_answer_and_the_report(tmp_path: Path) -> None:
    """Submit a tune job, then a verify job (``submit`` scope); a worker runs both; ``GET /v1/best`` and
    the report carry the flagged verification."""
    url = db.sqlite_url(tmp_path / "t.db")
    store = db.Store.open(url)
    settings = ApiSettings(db_url=url, tokens=TOKENS, warm_templates=False, best_cache_ttl_s=0)  # type: ignore[call-arg]
    common = {"template": "drifting_spin", "shapes": [{"n": 64}], "device": {"kind": "cpu"}, "samples": 15,
              "comparators": False}
    options = WorkerOptions(CPU, heartbeat_s=0.5, lease_s=10)
    with thread_server(settings, store) as base, httpx.Client(base_url=base, timeout=30) as http:
        tune = http.post("/v1/jobs", json={**common, "trials": 1, "finalists": 1}, headers=auth(SUBMIT))
        assert tune.status_code == 201, tune.text
        assert Worker(store, options).run(exit_when_idle=True) == 1  # its measurement process: the first
        created = http.post("/v1/jobs", json={**common, "kind": "verify", "processes": 2}, headers=auth(SUBMIT))
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["kind"] == "verify" and job["processes"] == 2 and job["progress"]["trials_total"] == 0
        refused = http.post("/v1/jobs", json={**common, "kind": "verify", "processes": 0}, headers=auth(SUBMIT))
        assert refused.status_code == 422
        assert Worker(store, options).run(exit_when_idle=True) == 1
        done = http.get(f"/v1/jobs/{job['id']}").json()
        (task,) = done["tasks"]
        assert done["state"] == "done" and task["state"] == "done" and task["best_us"] > 0
        best = http.get("/v1/best", params={"template": "drifting_spin", "device": "cpu", "shape": "n=64"}).json()
        check = best["verification"]
        assert best["match"] == "exact" and check["flagged"] and check["drift"] > 0.5 and check["processes"] == 2
        assert any("drifted" in note for note in best["notes"])
    assert "⚠ drift +" in render_markdown(collect(store, "drifting_spin"))


@pytest.mark.slow
def test_a_verify_job_over_http_re_measures_the_comparators_in_its_first_processes_only(tmp_path: Path) -> None:
    """``tuner submit --verify --processes 2 --comparator-processes 1`` to a real server: the option is kept with
    the job (``GET /v1/jobs/{id}``), a real worker passes it on, and the recorded verification's figures hold the
    comparator in process 1 only (the best in both). Above ``processes``, or on a tuning job, it is a 422; on a
    verify job without comparators it is dropped."""
    url = db.sqlite_url(tmp_path / "t.db")
    store = db.Store.open(url)
    _publish(store, "steady_spin")
    settings = ApiSettings(db_url=url, tokens=TOKENS, warm_templates=False, best_cache_ttl_s=0)  # type: ignore[call-arg]
    common = {"template": "steady_spin", "shapes": [{"n": 64}], "device": {"kind": "cpu"}, "samples": 15}
    with thread_server(settings, store) as base, httpx.Client(base_url=base, timeout=30) as http:
        for body, message in (
            ({"kind": "verify", "processes": 2, "comparator_processes": 3},
             "comparator_processes (3) must be at most processes (2)"),
            ({"kind": "verify", "comparator_processes": 6}, "comparator_processes (6) must be at most processes (5)"),
            ({"kind": "verify", "processes": 2, "comparator_processes": 0}, "greater than or equal to 1"),
            ({"trials": 1, "comparator_processes": 1}, "comparator_processes applies to verify jobs only"),
        ):
            refused = http.post("/v1/jobs", json={**common, **body}, headers=auth(SUBMIT))
            assert refused.status_code == 422, refused.text
            (error,) = refused.json()["detail"]
            assert error["loc"] == ["body", "comparator_processes"] and message in error["msg"], error
        assert http.get("/v1/jobs").json()["total"] == 0
        submitted = subprocess.run(
            [sys.executable, "-m", "tuner.cli", "submit", "steady_spin", "--shape", "n=64", "--device", "cpu",
             "--samples", "15", "--verify", "--processes", "2", "--comparator-processes", "1", "--url", base],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
            env={**env(), "TUNER_HOME": str(tmp_path / "home"), "TUNER_TOKEN": SUBMIT},
        )
        assert submitted.returncode == 0, submitted.stderr
        assert submitted.stdout.startswith("job 1 queued: verify steady_spin, 1 shape(s) × 2 fresh processes "
                                           "(comparators in the first 1) on cpu"), submitted.stdout
        job = http.get("/v1/jobs/1").json()
        assert (job["kind"], job["processes"], job["comparator_processes"], job["comparators"]) == ("verify", 2, 1,
                                                                                                    True)
        assert Worker(store, WorkerOptions(CPU, heartbeat_s=0.5, lease_s=10)).run(exit_when_idle=True) == 1
        done = http.get("/v1/jobs/1").json()
        assert done["state"] == "done" and done["tasks"][0]["best_us"] > 0 and done["comparator_processes"] == 1
        # without comparators the limit limits nothing: accepted, and dropped (as `tuner verify` ignores it)
        alone = http.post("/v1/jobs", headers=auth(SUBMIT), json={
            **common, "kind": "verify", "processes": 2, "comparators": False, "comparator_processes": 3})
        assert alone.status_code == 201, alone.text
        assert (alone.json()["comparators"], alone.json()["comparator_processes"]) == (False, None)
    (record,) = store.list_verifications(template="steady_spin")
    assert record.processes == 2
    labels = {p["process"]: [c["label"] for c in p["candidates"]] for p in record.figures}
    assert labels == {1: [BEST_LABEL, "comparator:library"], 2: [BEST_LABEL]}
    assert all(c["status"] == "OK" for p in record.figures for c in p["candidates"])


NEAR_NAME = "fault_vector_scale_near"


@contextlib.contextmanager
def _near_best_published(tmp_path: Path) -> Iterator[db.Store]:
    """A store whose study of the near-bound template (tests.fixtures.fault_templates) has its ``near`` config
    published from a final round of that config alone (a round before the near-bound checks), the template
    registered meanwhile as ``fault_vector_scale_near``."""
    from tuner.driver.study import CONFIG_LABEL, open_study, store_result
    from tuner.frozen import Config
    from tuner.results import MeasureResult, SampleSummary, Status

    registry.register(NEAR_NAME, NEAR_BOUND_REF)
    try:
        store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
        with Measurer(CPU, OPTIONS) as measurer:
            ctx = open_study(NEAR_NAME, SHAPE, store=store, measurer=measurer, sampler="random", seed=0, warm=False)
        published = store_result(ctx, MeasureResult(Status.OK, Config(mode="near", BLOCK=64), SampleSummary.of([5.0])),
                                 role="final", candidate=CONFIG_LABEL, round_id="before")
        store.publish_best(study_id=ctx.study_id, measurement_id=published)
        yield store
    finally:
        registry.unregister(NEAR_NAME)


def _near_fractions(count: int) -> dict[int, float]:
    """The near-bound template's ``near`` error on the inputs of each seed below ``count``, as fractions of its
    bound."""
    return {s: input_fraction("near", SHAPE, s) for s in range(count)}


def test_a_best_near_its_error_bound_is_checked_on_more_input_sets_and_disproved(tmp_path: Path) -> None:
    """A config published close to its error bound (a round before the near-bound checks) passes the
    verification's own input set; the verification checks it on the extra sets a final round does
    (VERIFY_NEAR_BOUND), finds it wrong on one, and disproves it: the best is withdrawn (its round held no
    other config). Without those checks the one set passes it."""
    extra = VERIFY_NEAR_BOUND.extra_seeds
    near = _near_fractions(300)
    seed = next(s for s in range(300 - extra) if 0.5 <= near[s] < 0.998
                and any(near[s + k] > 1.002 for k in range(1, extra + 1)))
    wrong_at = next(s for s in range(seed + 1, seed + extra + 1) if near[s] >= 1)
    with _near_best_published(tmp_path) as store:
        options = MeasureOptions(n_samples=5, warmup=1, seed=seed)
        one_set = verify_best(store, NEAR_NAME, SHAPE, device=CPU, processes=1, options=options, comparators=False,
                              near_bound=None)
        assert one_set.verdict.wrong == 0 and not one_set.disproved
        outcome = verify_best(store, NEAR_NAME, SHAPE, device=CPU, processes=1, options=options, comparators=False)
        assert outcome.verdict.wrong == 1 and outcome.disproved and outcome.withdrawn
        assert (outcome.processes[0].best.reason or "").startswith(f"inputs seed {wrong_at}: ")
        assert store.get_best(template=NEAR_NAME, shape_key=SHAPE.key()) is None


def test_a_best_within_a_final_rounds_headroom_of_its_bound_is_verified_against_the_bound(tmp_path: Path) -> None:
    """`tuner verify` checks against the bounds themselves: a best right on every set it checks, though
    within the headroom a final round asks of what it publishes (FINAL_NEAR_BOUND), is verified correct and
    stays published."""
    extra = VERIFY_NEAR_BOUND.extra_seeds
    near = _near_fractions(400)
    seed = next(s for s in range(400 - extra) if near[s] >= 0.5
                and FINAL_NEAR_BOUND.headroom + 0.003 <= max(near[s + k] for k in range(extra + 1)) < 0.997)
    with _near_best_published(tmp_path) as store:
        options = MeasureOptions(n_samples=5, warmup=1, seed=seed)
        outcome = verify_best(store, NEAR_NAME, SHAPE, device=CPU, processes=1, options=options, comparators=False)
        assert outcome.verdict.wrong == 0 and not outcome.disproved
        assert outcome.processes[0].best.status == "OK"
        assert store.get_best(template=NEAR_NAME, shape_key=SHAPE.key()) is not None
