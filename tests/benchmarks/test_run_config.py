"""benchmarks/run_config.py, the profilers' target: a served config from a real store, a comparator on its own
contract, and its errors (CPU, fault templates, real subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.fault_templates import CONTRACTS_REF, TUNABLE_REF
from tuner import db

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "TUNER_TEMPLATES": f"fault_vector_scale_tunable={TUNABLE_REF},"
       f"fault_vector_scale_contracts={CONTRACTS_REF}", "PYTHONPATH": str(ROOT), "COLUMNS": "200",
       "TRITON_INTERPRET": "1"}  # --device cpu runs Triton kernels under the interpreter, also on a GPU host
TUNABLE = "fault_vector_scale_tunable"


def _run(*args: str, module: bool = False) -> subprocess.CompletedProcess[str]:
    command = ["-m", "tuner.cli", *args] if module else ["benchmarks/run_config.py", *args]
    return subprocess.run([sys.executable, *command], capture_output=True, text=True, env=ENV, cwd=ROOT,
                          timeout=300)


def test_served_runs_the_config_the_store_serves_for_the_shape(tmp_path: Path) -> None:
    url = db.sqlite_url(tmp_path / "t.db")
    tuned = _run("tune", TUNABLE, "--shape", "n=64", "--trials", "3", "--device", "cpu", "--no-comparators",
                 "--db", url, module=True)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    best = db.Store.open(url).get_best(template=TUNABLE, shape_key="n=64")
    assert best is not None
    ran = _run(TUNABLE, "--shape", "n=64", "--served", url, "--device", "cpu", "--iters", "2")
    assert ran.returncode == 0, ran.stderr[-2000:]
    first, *errors = ran.stdout.strip().splitlines()
    assert first.startswith("config ") and first.endswith(" on n=64")
    assert json.loads(first.removeprefix("config ").removesuffix(" on n=64")) == dict(best.config)
    assert errors and all("relative L2 error" in line for line in errors)


def test_served_without_an_answer_for_the_shape_is_an_error(tmp_path: Path) -> None:
    url = db.sqlite_url(tmp_path / "empty.db")
    db.Store.open(url)
    ran = _run(TUNABLE, "--shape", "n=64", "--served", url, "--device", "cpu")
    assert ran.returncode != 0
    assert f"serves no config of {TUNABLE} for n=64 (cpu)" in ran.stderr


def test_a_comparator_runs_on_its_contract_and_a_wrapper_is_checked_on_what_it_returns() -> None:
    ran = _run("fault_vector_scale_contracts", "--shape", "n=64", "--comparator", "double", "--device", "cpu")
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.startswith("comparator double on n=2048\n")  # built on its contract's shape, not n=64
    assert "y: relative L2 error 0.00e+00" in ran.stdout
    wrapper = _run("fault_vector_scale_contracts", "--shape", "n=64", "--comparator", "wrapper", "--device", "cpu")
    assert wrapper.returncode == 0 and "y: relative L2 error 0.00e+00" in wrapper.stdout, wrapper.stdout
    # what the wrapper returns is what is checked (the buffers it was handed stay unwritten)
    wrong = _run("fault_vector_scale_contracts", "--shape", "n=64", "--comparator", "wrapper-wrong", "--device", "cpu")
    assert wrong.returncode == 0, wrong.stderr[-2000:]
    (line,) = [x for x in wrong.stdout.splitlines() if x.startswith("y: relative L2 error ")]
    assert float(line.removeprefix("y: relative L2 error ")) > 0.1, line


def test_served_is_what_tuner_best_answers_after_a_second_round(tmp_path: Path) -> None:
    """A study tuned twice (the second round republishes): --served runs the config `tuner best` answers."""
    url = db.sqlite_url(tmp_path / "t.db")
    for seed in ("1", "2"):
        tuned = _run("tune", TUNABLE, "--shape", "n=64", "--trials", "2", "--seed", seed, "--device", "cpu",
                     "--no-comparators", "--db", url, module=True)
        assert tuned.returncode == 0, tuned.stderr[-2000:]
    best = _run("best", TUNABLE, "--shape", "n=64", "--db", url, "--json", module=True)
    assert best.returncode == 0, best.stderr[-2000:]
    ran = _run(TUNABLE, "--shape", "n=64", "--served", url, "--device", "cpu", "--iters", "1")
    assert ran.returncode == 0, ran.stderr[-2000:]
    first = ran.stdout.splitlines()[0]
    assert json.loads(first.removeprefix("config ").removesuffix(" on n=64")) == json.loads(best.stdout)["config"]


def test_an_unknown_comparator_names_the_template_s_lines() -> None:
    ran = _run("fault_vector_scale_contracts", "--workload", "nope", "--comparator", "x", "--device", "cpu")
    assert ran.returncode != 0 and "unknown workload 'nope'" in ran.stderr
    ran = _run("fault_vector_scale_contracts", "--shape", "n=64", "--comparator", "x", "--device", "cpu")
    assert ran.returncode != 0
    assert "no comparator 'x'; fault_vector_scale_contracts has ['double', 'wrapper', 'wrapper-wrong']" in ran.stderr
