"""``tuner studies`` and ``tuner history``'s filters and formats, run as real processes against a stored sweep;
their bad input is a one-line error with exit code 2."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.processes import ROOT, env
from tests.fixtures.sweeps import NAME, TRIALS, store_sweep
from tuner import db
from tuner.frozen import Config

LONG = {f"parameter_with_a_long_name_{i}": f"value-{i}-" + "x" * 20 for i in range(12)}


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**env(), "COLUMNS": "80"}, timeout=300)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = db.sqlite_url(tmp_path_factory.mktemp("cli") / "t.db")
    with db.Store.open(url) as store:
        sweep = store_sweep(store)
        store_sweep(store, shape={"n": 1024}, device_name="other-cpu")
        with store.session() as session:
            db.add_measurement(session, study_id=sweep.study_id, role="trial", candidate="config",
                               config_json=Config(LONG).to_json(), status="RUNTIME_ERROR", trial_number=99,
                               reason="a config too long for any terminal")
    return url


def test_studies_lists_the_store(url: str) -> None:
    run = tuner("studies", "--db", url)
    assert run.returncode == 0, run.stderr
    assert "2 studies, newest first" in run.stdout and "n=1024" in run.stdout and "cpu:other-cpu" in run.stdout
    listed = json.loads(tuner("studies", NAME, "--db", url, "--json").stdout)
    assert [s["shape"] for s in listed] == [{"n": 1024}, {"n": 256}]
    first = listed[1]
    assert first["trials"] == 9 and first["failed"] == 5 and first["invalid"] == 1 and first["best_us"] == 19.0
    assert json.loads(tuner("studies", "--device", "cuda", "--db", url, "--json").stdout) == []


def test_history_filters_sorts_and_formats(url: str) -> None:
    (section,) = json.loads(tuner("history", NAME, "-s", "n=256", "--db", url, "--json", "--status",
                                  "wrong_result").stdout)
    assert section["total"] == 2 and {m["status"] for m in section["measurements"]} == {"WRONG_RESULT"}
    fastest = json.loads(tuner("history", NAME, "-s", "n=256", "--db", url, "--json", "--role", "trial",
                               "--sort", "median_us", "--limit", "2").stdout)[0]
    assert [m["median_us"] for m in fastest["measurements"]] == [20.0, 25.0] and fastest["total"] == len(TRIALS) + 1
    rows = list(csv.DictReader(io.StringIO(tuner("history", NAME, "-s", "n=256", "--db", url, "--csv").stdout)))
    assert len(rows) == len(TRIALS) + 1 + 3 and {r["role"] for r in rows} == {"trial", "final"}
    assert json.loads(next(r for r in rows if r["trial"] == "99")["config"]) == LONG
    table = tuner("history", NAME, "-s", "n=256", "--db", url)  # stdout is a pipe: nothing cut at 80 columns
    assert table.returncode == 0 and Config(LONG).to_json().replace(" ", "") in table.stdout.replace(" ", "")
    both = json.loads(tuner("history", NAME, "-s", "n=256", "-s", "n=1024", "--db", url, "--json").stdout)
    assert [s["study"]["shape"] for s in both] == [{"n": 256}, {"n": 1024}]


@pytest.mark.parametrize(("args", "message"), [
    (["history", NAME, "-s", "n=256", "--role", "trials"], "unknown --role 'trials'; expected trial or final"),
    (["history", NAME, "-s", "n=256", "--status", "FINE"], "unknown --status 'FINE'"),
    (["history", NAME, "-s", "n=256", "--sort", "speed"], "unknown --sort 'speed'"),
    (["history", NAME, "-s", "n=256", "--json", "--csv"], "give --json or --csv, not both"),
    (["history", NAME], "give at least one --workload, --shape or --all-workloads"),
    (["history", NAME, "-s", "n=77"], "no study stored for fault_vector_scale_tunable at n=77"),
    (["history", "nope", "-s", "n=1"], "unknown template 'nope'"),
    (["studies", "nope"], "unknown template 'nope'"),
    (["studies", "--device", "tpu"], "unknown device 'tpu'"),
])
def test_bad_input_is_one_line_exit_2(url: str, args: list[str], message: str, tmp_path: Path) -> None:
    run = tuner(*args, "--db", url)
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert run.returncode == 2 and len(lines) == 1 and message in lines[0], run.stderr
