"""benchmarks/regret.py over a small real SQLite store: its oracle skips, with a line, a shape none of whose
choices was ever timed, and still reports the others."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.fixtures.fault_templates import TUNABLE_REF
from tests.fixtures.servers import publish
from tuner import db, registry
from tuner.frozen import Config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from regret import load, oracle  # noqa: E402

TUNABLE = "fault_vector_scale_tunable"


def test_the_oracle_skips_a_shape_with_no_timed_choice_and_reports_the_others(tmp_path: Path) -> None:
    registry.register(TUNABLE, TUNABLE_REF)
    path = tmp_path / "store.db"
    with db.Store.open(db.sqlite_url(path)) as store:
        publish(store, TUNABLE, {"n": 1024}, {"mode": "ok", "BLOCK": 512}, 10.0)
        best = publish(store, TUNABLE, {"n": 2048}, {"mode": "ok", "BLOCK": 256}, 12.0)
        with store.session() as session:
            # 2048's study also timed 1024's config (8% slower); an attempt at the default failed.
            db.add_measurement(session, study_id=best.study_id, role="trial", candidate="config", status="OK",
                               config_json=Config({"mode": "ok", "BLOCK": 512}).to_json(), median_us=13.0,
                               n_samples=3)
            db.add_measurement(session, study_id=best.study_id, role="trial", candidate="config",
                               status="TIMEOUT", config_json=Config({"mode": "ok", "BLOCK": 64}).to_json(),
                               reason="too slow")
    work = tmp_path / "work"
    work.mkdir()
    lines = oracle(load([path], work))
    text = "\n".join(lines)
    # 1024: 2048's config and the default were never timed on it: skipped, said so, not a crash.
    assert ("- store.db, fault_vector_scale_tunable n=1024: skipped, no choice timed on it (2 choices: n=2048's, "
            "the default; none has an OK measurement in its records)") in lines, text
    # 2048 is still reported: its best choice, 1024's config, loses 8.3% (> 5%): a row of the table.
    assert "| store.db | fault_vector_scale_tunable | n=2048 | +8.3% (n=1024's) | 0 of 1 | 1 |" in lines, text
    assert "over 1 shapes (1 skipped: no choice timed), 1 above 5%" in text, text
