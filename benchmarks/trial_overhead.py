"""Per-trial overhead of a sweep, read back from the store: for every measured trial, the time from Optuna's
``ask`` to its ``tell`` (trial datetime_start → datetime_complete) minus the time spent building, verifying
and timing the candidate (the measurement's phase times). What remains is tuner's own cost per trial:
sampling, constraint and duplicate checks, subprocess messages, store writes, Optuna's storage.
Meaningful for sweeps run one trial at a time (in batched sweeps a trial also waits for its batch).

usage: python benchmarks/trial_overhead.py DB_URL TEMPLATE
"""

from __future__ import annotations

import statistics
import sys

import optuna

from tuner import db
from tuner.results import Status


def main(url: str, template: str) -> None:
    store = db.Store.open(url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print("| shape | measured trials | overhead median ms | p90 ms | max ms |\n|---|---|---|---|---|")
    everything: list[float] = []
    with store.session() as session:
        studies = db.list_studies(session, template=template)
        for st in studies:
            rows = {r.trial_number: r for r in db.list_measurements(session, study_id=st.id, role="trial")
                    if r.status is not Status.INVALID}
            study = optuna.load_study(study_name=st.name, storage=store.optuna_url)
            overheads = []
            for t in study.trials:
                m = rows.get(t.number)
                if m is None or t.datetime_complete is None or "duplicate_of" in t.user_attrs:
                    continue
                wall = (t.datetime_complete - t.datetime_start).total_seconds()
                overheads.append(wall - (m.build_s or 0) - (m.verify_s or 0) - (m.measure_s or 0))
            if overheads:
                q = statistics.quantiles(overheads, n=10)[-1] if len(overheads) > 1 else overheads[0]
                print(f"| {st.shape_key} | {len(overheads)} | {statistics.median(overheads) * 1e3:.1f} | "
                      f"{q * 1e3:.1f} | {max(overheads) * 1e3:.1f} |")
                everything += overheads
    if everything:
        print(f"\nall: {len(everything)} trials, median {statistics.median(everything) * 1e3:.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
