"""The ``tuner`` command line, run as a real process (``python -m tuner.cli``) against SQLite files."""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.fault_templates import BROKEN_REF, HANGING_REF, TUNABLE_REF
from tuner import db
from tuner.results import Status

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = (f"fault_vector_scale_tunable={TUNABLE_REF},fault_vector_scale_broken={BROKEN_REF},"
           f"fault_vector_scale_hanging={HANGING_REF}")
VS = "fault_vector_scale_tunable"


ENV = {**os.environ, "TUNER_TEMPLATES": PLUGINS, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def tuner(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, env=ENV, cwd=ROOT,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tune", "nope", "--shape", "n=1"], "unknown template 'nope'"),
        (["tune", VS, "--workload", "huge"], "unknown workload 'huge' for fault_vector_scale_tunable"),
        (["tune", VS, "--shape", "n=1,n"], "malformed shape"),
        (["tune", VS, "--shape", "n=many"], "shape dim n: expected an integer"),
        (["tune", VS, "--shape", "m=3"], "unknown shape dim(s) m"),
        (["tune", VS], "give at least one --workload, --shape or --all-workloads"),
        (["tune", VS, "--shape", "n=64", "--sampler", "anneal"], "unknown sampler 'anneal'"),
        (["tune", VS, "--shape", "n=64", "--device", "tpu"], "unknown device 'tpu'"),
        (["tune", "fault_vector_scale_broken", "--shape", "n=64"],
         "broken_space.yaml: parameters.BLOCK.pow2: Value error, low (24)"),
        (["best", VS, "--shape", "n=64"], "no best config stored"),
        (["best", VS, "--shape", "n=64", "--device", "cpu"], "n=64 on cpu; run `tuner tune` first, or ask with "
         "--lookup --device KIND for what `GET /v1/best` serves (a nearest shape's best or the default)"),
        (["best", VS, "--shape", "n=64", "--lookup"], "--lookup needs --device (cuda, npu or cpu)"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    url = db.sqlite_url(tmp_path / "t.db")
    run = tuner(*args, "--db", url)
    assert run.returncode == 2, run.stderr + run.stdout
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], run.stderr
    if args[0] == "tune":
        assert not (tmp_path / "t.db").exists()


@pytest.mark.parametrize("command", [["report", VS], ["export"]])
def test_an_output_file_that_cannot_be_written_is_one_line_exit_2(tmp_path: Path, command: list[str]) -> None:
    """`-o` into a folder that does not exist printed a traceback (FileNotFoundError) and exit code 1."""
    url = db.sqlite_url(tmp_path / "t.db")
    target = tmp_path / "no-such-folder" / "out"
    run = tuner(*command, "-o", str(target), "--db", url)
    assert run.returncode == 2, run.stderr + run.stdout
    errors = [ln for ln in run.stderr.splitlines() if ln.startswith("error")]  # export warns of the broken plugin
    assert errors == [f"error: cannot write {target}: No such file or directory"], run.stderr
    assert "Traceback" not in run.stderr and not target.parent.exists()


def test_unreachable_database_is_named_quickly(tmp_path: Path) -> None:
    started = time.monotonic()
    run = tuner("tune", VS, "--shape", "n=64", "--device", "cpu",
                "--db", "postgresql+psycopg://tuner:secret@127.0.0.1:1/none")
    assert run.returncode == 2
    line = run.stderr.strip()
    assert line.startswith("error: ") and "127.0.0.1:1" in line and "secret" not in line
    assert time.monotonic() - started < 60


def test_tune_then_best_history_and_report(tmp_path: Path) -> None:
    url = db.sqlite_url(tmp_path / "t.db")
    run = tuner("tune", VS, "--shape", "n=256", "--trials", "8", "--device", "cpu", "--samples", "3",
                "--sampler", "random", "--seed", "1", "--db", url)
    assert run.returncode == 0, run.stderr
    assert "best config for n=256" in run.stdout and "published" in run.stdout
    assert f"store: {url}" in run.stdout and "n=256: new study 1" in run.stdout
    assert "# fault_vector_scale_tunable" in run.stdout and "geometric mean" in run.stdout

    best = tuner("best", VS, "--shape", "n=256", "--db", url, "--json")
    assert best.returncode == 0, best.stderr
    assert '"mode": "ok"' in best.stdout and '"timer": "cpu-wall"' in best.stdout
    # The fields of GET /v1/best's answer, named alike (an exact match: the shape is the measured one).
    from api.schemas import BestOut

    answer = json.loads(best.stdout)
    assert set(answer) == set(BestOut.model_fields) - {"stale"}  # every field but the server's cache flag
    assert answer["software"] is not None and answer["verification"] is None  # what it ran under; not verified
    assert answer["match"] == "exact" and answer["shape"] == answer["source_shape"] == {"n": 256}
    assert answer["template_version"] == answer["measured_version"] == "1" and answer["device_kind"] == "cpu"

    history = tuner("history", VS, "--shape", "n=256", "--db", url, "--role", "trial")
    assert history.returncode == 0, history.stderr
    with db.Store.open(url) as store, store.session() as session:
        (study,) = db.list_studies(session, template=VS)
        rows = db.list_measurements(session, study_id=study.id, role="trial")
    assert len(rows) >= 8
    assert f"{len(rows)} measurements" in history.stdout
    for row in rows:
        assert row.status.value in history.stdout
        if row.reason:
            assert row.reason.splitlines()[0][:40] in history.stdout

    report = tuner("report", VS, "--db", url, "--output", str(tmp_path / "r.md"))
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "r.md").read_text()
    assert "| n=256 |" in text and "torch µs" in text and "cpu-wall" in text

    report = tuner("report", VS, "--db", url, "--errors")
    assert report.returncode == 0, report.stderr

    again = tuner("tune", VS, "--shape", "n=256", "--trials", "1", "--device", "cpu", "--samples", "3",
                  "--no-comparators", "--finalists", "1", "--db", url)
    invalid = sum(1 for r in rows if r.status is Status.INVALID)
    resumed = (f"n=256: resuming study 1 ({len(rows) - invalid} measured trials stored"
               + (f", {invalid} invalid configs pruned)" if invalid else ")"))
    assert again.returncode == 0 and resumed in again.stdout, again.stdout
    assert "### Relative L2 error per output" in report.stdout
    assert "| n=256 | best config | 0.0e+00 |" in report.stdout  # exact output y
    assert "| n=256 | torch | 0.0e+00 |" in report.stdout

    # Two final rounds ran, each publishing by today's rule: its replay over the stored rounds agrees with them.
    rejudge = tuner("rejudge", VS, "--db", url, "--json")
    assert rejudge.returncode == 0, rejudge.stderr
    (judged,) = json.loads(rejudge.stdout)
    with db.Store.open(url) as store:
        published = store.get_study_best(study_id=judged["study_id"])
    assert (judged["rounds"], judged["changed"], judged["applied"]) == (2, False, False)
    assert judged["published"] == judged["rule"] == published.config
    shown = tuner("rejudge", VS, "--shape", "n=256", "--db", url)
    assert shown.returncode == 0 and "1 studies with a published best, 0 differ from the rule" in shown.stderr


def test_submit_refuses_a_wrong_option_combination_before_any_request() -> None:
    """The job rule of the server (records.check_job_kind), asked locally: nothing listens on port 1, so a
    request would fail otherwise."""
    for args, says in ((["--comparator-processes", "2"], "comparator_processes applies to verify jobs only"),
                       (["--verify", "--processes", "2", "--comparator-processes", "3"],
                        "comparator_processes must be between 1 and processes (2), got 3"),
                       (["--verify", "--trials", "5"], "--trials is for tuning jobs")):
        run = tuner("submit", VS, "--shape", "n=64", *args, "--url", "http://127.0.0.1:1")
        assert run.returncode == 2 and says in run.stderr and "127.0.0.1:1" not in run.stderr, run.stderr
    # without comparators the limit limits nothing (as `tuner verify --no-comparators`): the request is made
    run = tuner("submit", VS, "--shape", "n=64", "--verify", "--no-comparators", "--processes", "2",
                "--comparator-processes", "3", "--url", "http://127.0.0.1:1")
    assert run.returncode != 0 and "127.0.0.1:1" in run.stderr, run.stderr


def test_time_limit_ends_the_sweep_and_still_publishes(tmp_path: Path) -> None:
    """--time-limit: no trial starts after it (opening the study alone takes longer than 1 ms), the final
    round measures the default and publishes it; the output says the limit cut the sweep."""
    url = db.sqlite_url(tmp_path / "t.db")
    run = tuner("tune", VS, "--shape", "n=256", "--trials", "5", "--device", "cpu", "--samples", "3",
                "--no-comparators", "--time-limit", "0.001", "--db", url)
    assert run.returncode == 0, run.stderr
    assert "n=256: time limit of 0.001 s reached after 0 of 5 measured trials" in run.stdout
    assert "best config for n=256" in run.stdout and "published" in run.stdout
    with db.Store.open(url) as store, store.session() as session:
        (study,) = db.list_studies(session, template=VS)
        assert db.list_measurements(session, study_id=study.id, role="trial") == []
    refused = tuner("tune", VS, "--shape", "n=256", "--device", "cpu", "--time-limit", "0", "--db", url)
    assert refused.returncode == 2 and "--time-limit" in refused.stderr


def test_sigterm_stops_a_sweep_and_queues_its_unmeasured_trial_again(tmp_path: Path) -> None:
    """`timeout` or a batch system stops `tuner tune` with SIGTERM: the trial being measured (here the
    hanging default) is failed with the reason and queued again, so that the study's next run measures
    it; nothing is left RUNNING; the threads' stacks are on stderr."""
    import optuna

    url = db.sqlite_url(tmp_path / "t.db")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "tune", "fault_vector_scale_hanging", "--shape", "n=256",
         "--trials", "4", "--device", "cpu", "--samples", "3", "--timeout", "300", "--db", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 120
        running: list[optuna.trial.FrozenTrial] = []
        while not running and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            try:
                (summary,) = optuna.get_all_study_summaries(url) or [None]
                if summary is not None:
                    study = optuna.load_study(study_name=summary.study_name, storage=url)
                    running = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
            except Exception:  # the store is being created by the sweep
                continue
        assert running, "the sweep never started measuring"
        time.sleep(2)  # inside the hanging measurement
        started = time.monotonic()
        proc.send_signal(15)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0 and time.monotonic() - started < 60, err
    trials = optuna.load_study(study_name=study.study_name, storage=url).get_trials()
    assert optuna.trial.TrialState.RUNNING not in [t.state for t in trials]
    failed = trials[0]
    assert failed.state is optuna.trial.TrialState.FAIL and failed.params == {"mode": "hang", "BLOCK": 64}
    assert "KeyboardInterrupt: stopped by signal 15" in failed.user_attrs["reason"]
    # before stopping, every thread's stack went to stderr: a run a `timeout` stopped says where it waited
    assert "most recent call first" in err and "tuner/cli/app.py" in err, err
    waiting = [t.system_attrs["fixed_params"] for t in trials if t.state is optuna.trial.TrialState.WAITING]
    assert sorted(waiting, key=str) == [{"mode": "hang", "BLOCK": 64}, {"mode": "ok", "BLOCK": 64}]


@pytest.mark.parametrize("ref", ["tests.fixtures.fault_templates:NoSuchTemplate", "tests.no_such_module:Toy"])
def test_tuner_templates_naming_what_does_not_import_is_one_clear_line(tmp_path: Path, ref: str) -> None:
    env = {**ENV, "TUNER_TEMPLATES": f"{PLUGINS},ghost={ref}"}

    def run(*args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
        done = subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=600)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr + done.stdout
        return done, [ln for ln in done.stderr.splitlines() if ln.strip()]

    clear = f"error: template 'ghost' (from TUNER_TEMPLATES): cannot import {ref}"
    done, lines = run("tune", "ghost", "--shape", "n=64", "--db", db.sqlite_url(tmp_path / "t.db"))
    assert len(lines) == 1 and lines[0].startswith(clear), done.stderr
    # The list shows the templates that load, and one line for each that does not.
    done, lines = run("templates")
    assert VS in done.stdout and "mamba2_chunk_cumsum" in done.stdout and "ghost" not in done.stdout
    assert len(lines) == 2 and any(ln.startswith(clear) for ln in lines), done.stderr
    assert any("broken_space.yaml" in ln for ln in lines), done.stderr


def test_a_narrow_console_folds_the_final_rounds_configs_and_reasons_instead_of_cutting_them() -> None:
    """A piped `tuner tune` prints at 80 columns: a MIMO config (a JSON object without spaces) was cut with
    an ellipsis there, and the finalists of a failed round could not be told apart in the log."""
    import io

    from rich.console import Console

    from tuner.driver.study import FinalEntry, FinalRound
    from tuner.driver.tuning import ShapeSummary, _print_summary
    from tuner.frozen import Config, Shape
    from tuner.results import MeasureResult, Status

    config = Config(variant="split2", chunk_rows=32, block_n=16, prec="tf32", prec_rot="lowp3", num_warps=2,
                    num_stages=2, scan_block=512, scan_chunks=4, group_chunks=4)
    reason = "inputs seed 1000004: output 'dMIMO_Z': relative L2 error 0.001 exceeds its bound 0.001"
    entry = FinalEntry("config", MeasureResult(Status.WRONG_RESULT, config, reason=reason), 1)
    out = io.StringIO()
    summary = ShapeSummary("w", Shape(n=1), "s", (), FinalRound("r", (entry,), None, False))
    _print_summary(Console(file=out, width=80), summary)
    cells = {"config": "", "reason": "", "status": ""}
    for line in out.getvalue().splitlines():
        parts = [p.strip() for p in line.split("│")]
        if len(parts) == 8:  # a body row: the cells between the borders
            cells["config"] += parts[2]
            cells["status"] += parts[3]
            cells["reason"] += parts[6]
    assert cells["config"] == json.dumps(config.to_dict(), separators=(",", ":"))
    assert cells["status"] == "WRONG_RESULT"
    assert cells["reason"].replace(" ", "") == reason.replace(" ", "")


def test_best_prints_a_carried_versions_best_as_the_server_serves_it(tmp_path: Path) -> None:
    """MIMO version 4 carries version 2: `tuner best` prints version 2's best completed (state_pass=scan,
    qk_warps=same), as GET /v1/best serves it, with measured_version 2; a version-1 best (not carried) is not
    served."""
    from tests.fixtures.servers import publish

    r4 = {"B": 4, "S": 2048, "H": 16, "G": 1, "N": 128, "P": 64, "R": 4, "rotary_divisor": 4, "dtype": "bfloat16"}
    v2 = {"variant": "split2", "chunk_rows": 32, "block_n": 16, "prec": "lowp3", "prec_rot": "lowp3",
          "num_warps": 2, "num_stages": 2, "scan_block": 512, "scan_chunks": 4, "group_chunks": 4}
    url = db.sqlite_url(tmp_path / "t.db")
    with db.Store.open(url) as store:
        publish(store, "mamba3_mimo_bwd", {**r4, "R": 2}, v2, 2001.8, device_kind="cuda", version="1")
        publish(store, "mamba3_mimo_bwd", r4, v2, 3681.6, device_kind="cuda", version="2")
    shape = ",".join(f"{k}={v}" for k, v in r4.items())
    best = tuner("best", "mamba3_mimo_bwd", "--shape", shape, "--db", url, "--json")
    assert best.returncode == 0, best.stderr
    answer = json.loads(best.stdout)
    added = {"state_pass": "scan", "qk_warps": "same"}
    assert answer["config"] == {**v2, **added} and answer["median_us"] == 3681.6
    assert (answer["template_version"], answer["measured_version"]) == ("4", "2")
    r2 = tuner("best", "mamba3_mimo_bwd", "--shape", shape.replace("R=4", "R=2"), "--db", url)
    assert r2.returncode != 0 and "no best config stored" in r2.stderr
    # a carried config the current constraints reject (scan_block 2048 is for the walk) is repaired, as served
    n64 = shape.replace("N=128", "N=64")
    with db.Store.open(url) as store:
        publish(store, "mamba3_mimo_bwd", {**r4, "N": 64}, {**v2, "scan_block": 2048}, 2390.6, device_kind="cuda",
                version="2")
    repaired = json.loads(tuner("best", "mamba3_mimo_bwd", "--shape", n64, "--db", url, "--json").stdout)
    assert repaired["match"] == "nearest" and repaired["config"] == {**v2, **added, "scan_block": 1024}
    assert repaired["repaired"] == [{"param": "scan_block", "entry": 2048, "served": 1024}]


def test_best_lookup_answers_any_shape_as_the_server_does(tmp_path: Path) -> None:
    """`tuner best --lookup` answers as GET /v1/best: the exact entry, a nearest shape's config (repaired where
    the constraint BLOCK <= n rejects it) with its differences, the default beyond the near distance for an
    entry without a default figure (said in a note); it needs a device kind. The server's own answers agree
    (the same function, tuner.store.entries.lookup_answer, over a real server here)."""
    from tests.fixtures.servers import TOKENS, publish, thread_server
    from tuner import registry
    from tuner.api.settings import ApiSettings

    registry.register(VS, TUNABLE_REF)
    url = db.sqlite_url(tmp_path / "t.db")
    with db.Store.open(url) as store:
        publish(store, VS, {"n": 256}, {"mode": "ok", "BLOCK": 256}, 19.0)

    def ask(n: int, name: str = "test-cpu") -> dict[str, Any]:
        run = tuner("best", VS, "--shape", f"n={n}", "--lookup", "--device", "cpu", "--device-name", name,
                    "--db", url, "--json")
        assert run.returncode == 0, run.stderr
        return dict(json.loads(run.stdout))

    exact, near, far, elsewhere = ask(256), ask(128), ask(256 << 4), ask(256, "other-cpu")
    assert elsewhere["match"] == "nearest" and elsewhere["notes"] == [
        "nothing measured on 'other-cpu'; this config was measured on 'test-cpu'"]
    assert (exact["match"], exact["config"], exact["median_us"]) == ("exact", {"mode": "ok", "BLOCK": 256}, 19.0)
    assert (near["match"], near["distance"], near["source_shape"]) == ("nearest", 1.0, {"n": 256})
    assert near["config"] == {"mode": "ok", "BLOCK": 128} and near["repaired"][0]["served"] == 128
    assert near["differences"] == [{"what": "shape.n", "requested": 128, "entry": 256}]
    assert far["match"] == "default" and far["config"] == {"mode": "ok", "BLOCK": 64} and far["median_us"] is None
    assert any("no default figure" in n for n in far["notes"]), far["notes"]
    settings = ApiSettings(db_url=url, tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    with db.Store.open(url) as store, thread_server(settings, store) as base:
        for n, name, ours in ((256, "test-cpu", exact), (128, "test-cpu", near), (4096, "test-cpu", far),
                              (256, "other-cpu", elsewhere)):
            theirs = httpx.get(f"{base}/v1/best", params={"template": VS, "device": "cpu", "shape": f"n={n}",
                                                          "device_name": name}, timeout=30).json()
            assert {k: theirs[k] for k in ("match", "config", "distance", "notes")} == {
                k: ours[k] for k in ("match", "config", "distance", "notes")}, (n, theirs, ours)
    no_kind = tuner("best", VS, "--shape", "n=128", "--lookup", "--db", url)
    assert no_kind.returncode == 2 and "--lookup needs --device" in no_kind.stderr


def test_sigterm_dumps_the_stacks_each_time_a_command_installs_its_handler(capfd: pytest.CaptureFixture[str]) -> None:
    """Two commands in one process, another handler set between them (a worker's): the second command's
    SIGTERM still writes the stacks before stopping it (faulthandler's handler, replaced by signal.signal,
    was not installed again by a second register)."""
    from tuner.cli import app

    before = signal.getsignal(signal.SIGTERM)
    try:
        app._stop_on_sigterm()
        signal.signal(signal.SIGTERM, lambda *_: None)  # e.g. `tuner worker`'s own handler
        app._stop_on_sigterm()
        capfd.readouterr()
        with pytest.raises(KeyboardInterrupt, match="stopped by signal 15"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode boundary
        err = capfd.readouterr().err
        assert "most recent call first" in err and "test_cli.py" in err, err
    finally:
        faulthandler.unregister(signal.SIGTERM)
        signal.signal(signal.SIGTERM, before)
