"""benchmarks/search.py on a real exhaustive record (the CPU sweep of tests/fixtures/recorded.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.fixtures.fault_templates import TUNABLE_REF
from tests.fixtures.recorded import NAME
from tuner import db, registry

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from search import STRATEGIES, load_cases, main, simulate  # noqa: E402


def _path(url: str) -> Path:
    path = db.sqlite_file(url)
    assert path is not None, url
    return path


def test_every_strategy_reaches_the_exhaustive_best_of_a_small_record(recorded_sweep: str, tmp_path: Path) -> None:
    registry.register(NAME, TUNABLE_REF)
    cases, notes = load_cases([_path(recorded_sweep)], tmp_path)
    assert notes == []
    assert [(c.label, len(c.valid), c.exhaustive) for c in cases] == [("n=64", 12, True), ("n=128", 16, True)]
    case = cases[1]
    best64 = cases[0].record.best(cases[0].shape)
    assert best64 is not None and [(e.shape, e.config) for e in case.neighbours] == [
        (cases[0].shape.to_dict(), best64[0].to_dict())]
    assert case.budget == 16
    for _, sampler, startup, warm in STRATEGIES:
        run = simulate(case, sampler, startup, warm, seed=1)
        # 16 valid configs, 4 of them OK: a budget of all of them finds the best (grid: every point once).
        assert run.trace[-1] == case.best_us
        assert all(a >= b for a, b in zip(run.trace, run.trace[1:], strict=False))
        assert len(run.trace) <= case.budget


def test_the_report_names_the_records_and_the_goal(recorded_sweep: str, tmp_path: Path) -> None:
    registry.register(NAME, TUNABLE_REF)
    out = tmp_path / "search.md"
    main([str(_path(recorded_sweep)), "--seeds", "3", "-o", str(out)])
    text = out.read_text()
    assert "python benchmarks/search.py" in text and "--seeds 3" in text
    assert "## fault_vector_scale_tunable — n=128 (record.db)" in text
    assert "16 valid configs in the recorded subspace (exhaustive)" in text
    goal = text.split("## Goal")[1].split("\n## ")[0]
    rows = [line for line in goal.splitlines() if line.startswith("| fault_vector_scale_tunable")]
    assert len(rows) == 2
