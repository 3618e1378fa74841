"""What `tuner tune` says when it resumes a study: measured trials and pruned invalid configs counted apart
(the real driver and store, measurements on the CPU backend of the fault-injection template)."""

from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console

from tests.fixtures.fault_templates import TUNABLE_REF
from tuner import db, registry
from tuner.driver.tuning import tune_shapes
from tuner.frozen import Shape
from tuner.measure.devices.base import DeviceSpec
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.results import Status

NAME = "fault_vector_scale_tunable"


def test_a_resumed_study_counts_measured_trials_and_invalid_configs_apart(tmp_path: Path) -> None:
    registry.register(NAME, TUNABLE_REF)
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    shape = Shape(n=32)  # BLOCK <= n: most of BLOCK 16..512 is invalid here, and random proposes them
    with Measurer(DeviceSpec("cpu"), MeasureOptions(n_samples=3, warmup=1, timeout_s=60)) as measurer:
        (first,) = tune_shapes(NAME, [("n32", shape)], store=store, measurer=measurer, trials=3, sampler="random",
                               seed=3, comparators=False, finalists=1)
        invalid = sum(1 for r in first.trials if r.status is Status.INVALID)
        measured = sum(1 for r in first.trials if r.measured)
        assert invalid > 0 and measured == 3
        console = Console(record=True, width=300)
        tune_shapes(NAME, [("n32", shape)], store=store, measurer=measurer, trials=1, sampler="random", seed=4,
                    comparators=False, finalists=1, console=console)
    text = console.export_text()
    assert "final round (measured in " in text  # no pool here: no prebuild figure
    # and where the measuring call's time went, part by part
    assert re.search(r"n32: final round's measuring call: process start \d+\.\d s, template \d+\.\d s, builds and "
                     r"checks \d+\.\d s, timing \d+\.\d s, other \d+\.\d s", text), text
    assert (f"n32: resuming study 1 ({measured} measured trials stored, {invalid} invalid configs pruned)"
            in text), text
