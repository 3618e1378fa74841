"""The pages' figures as data (``tuner.api.ui.plots``, pure functions): axis ticks, shape labels and the
template page's dot plot of best, default and comparator lines. How they render is tests/ui/test_browser.py's."""

from __future__ import annotations

import json

import pytest

from tuner.api.ui.plots import lines_figure, log_ticks, shape_labels, shared_parts


@pytest.mark.parametrize("values", [
    [4.1285, 12.928],  # the H200 study whose log axis was labelled "10" alone
    [1.89, 2.02],
    [17.9, 18.5],
    [100.0, 104.0],
    [0.031, 0.036],
    [2.0, 2000.0],
    [5.0],
])
def test_a_log_axis_gets_at_least_three_ticks_inside_its_range(values: list[float]) -> None:
    ticks = log_ticks(values)["tickvals"]
    lo, hi = min(values) / 1.15, max(values) * 1.15
    assert len(ticks) >= 3, ticks
    assert all(lo <= t <= hi for t in ticks), (ticks, lo, hi)
    assert ticks == sorted(set(ticks))
    assert log_ticks(values)["ticktext"] == [f"{t:g}" for t in ticks]


def test_ticks_of_a_wide_range_are_one_two_five_per_decade() -> None:
    assert log_ticks([2.0, 2000.0])["tickvals"] == [2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert log_ticks([None, float("nan"), 0.0, -1.0]) == {}


def test_shape_labels_leave_out_what_every_shape_key_shares() -> None:
    labels = ["B=1,H=128,Q=256,S=16384,dtype=bfloat16,softplus=true", "mamba2-780m-b1-s4k",
              "B=8,H=64,Q=256,S=2048,dtype=float32,softplus=true"]
    assert shared_parts(labels) == ["Q=256", "softplus=true"]
    assert shape_labels(labels) == ["B=1, H=128, S=16384, dtype=bfloat16", "mamba2-780m-b1-s4k",
                                    "B=8, H=64, S=2048, dtype=float32"]
    assert shared_parts(["n=256"]) == [] and shape_labels(["n=256"]) == ["n=256"]  # one key: nothing is shared
    assert shape_labels(["a=<b>x</b>", "a=<b>x</b>,c=1"]) == ["a=&lt;b&gt;x&lt;/b&gt;", "c=1"]


def _rows() -> list[dict[str, object]]:
    lines = [{"mamba_ssm-fp32-bh4": 6.0, "mamba_ssm-wrapper": 5.5, "mamba_ssm-tileops": None, "ceiling": 3.0,
              "other-one": None},
             {"mamba_ssm-fp32-bh4": 7.0, "mamba_ssm-wrapper": 9.0, "mamba_ssm-tileops": None, "ceiling": None,
              "other-one": None}]
    return [{"workload": f"B={b},S=2048", "best_us": best, "default_us": default, "lines": line}
            for b, best, default, line in ((1, 4.0, 5.0, lines[0]), (8, 6.0, None, lines[1]))]


def test_a_family_of_lines_is_drawn_as_its_fastest_and_each_line_waits_in_the_legend() -> None:
    figure = lines_figure(_rows())
    traces = {(t.get("legendgroup"), t["name"]): t for t in figure["data"]}
    assert set(traces) == {(None, "best"), (None, "default"), (None, "ceiling"),
                           ("mamba_ssm", "fastest of 3 lines"), ("mamba_ssm", "fp32-bh4"), ("mamba_ssm", "wrapper")}
    # other-one and mamba_ssm-tileops never ran OK: no trace (a family counts its lines, measured or not)
    head = traces[("mamba_ssm", "fastest of 3 lines")]
    assert head["x"] == [5.5, 7.0] and head["text"] == ["mamba_ssm-wrapper", "mamba_ssm-fp32-bh4"]
    assert "visible" not in head and head["legendgrouptitle"] == {"text": "mamba_ssm"}
    assert all(traces[("mamba_ssm", n)]["visible"] == "legendonly" for n in ("fp32-bh4", "wrapper"))
    assert traces[(None, "default")]["x"] == [5.0, None]
    for t in figure["data"]:  # one row per shape, the shared part left out, the whole shape in the hover
        assert t["y"] == ["B=1", "B=8"] and t["customdata"] == ["B=1,S=2048", "B=8,S=2048"]
    layout = figure["layout"]
    assert layout["meta"] == {"shared": ["S=2048"]} and layout["yaxis"]["autorange"] == "reversed"
    assert layout["xaxis"]["type"] == "log" and len(layout["xaxis"]["tickvals"]) >= 3
    json.dumps(figure)  # what the page embeds


def test_lines_of_a_small_family_stay_lines_of_their_own() -> None:
    rows = [{"workload": "w", "best_us": 2.0, "default_us": 3.0, "lines": {"lib-a": 2.5, "lib-b": 2.6}}]
    names = [(t["name"], t.get("visible", True)) for t in lines_figure(rows)["data"]]
    assert names == [("best", True), ("default", True), ("lib-a", True), ("lib-b", True)]


def test_the_lines_drawn_take_distinct_colours_and_names_are_escaped() -> None:
    lines = {"torch-a": 1.0, "torch-b": 1.1, "triton": 1.2, "cublas-x": 1.3, "cublas-y": 1.4, "cublas-z": 1.5,
             "<b>odd</b>": 1.6}
    figure = lines_figure([{"workload": "w", "best_us": 1.0, "default_us": 2.0, "lines": lines}])
    drawn = [t for t in figure["data"] if t.get("visible", True) is True]
    colours = [t["marker"]["color"] for t in drawn]
    assert len(colours) == len(set(colours)) == 7, [(t["name"], t["marker"]["color"]) for t in drawn]
    assert "&lt;b&gt;odd&lt;/b&gt;" in [t["name"] for t in drawn] and "<b>" not in json.dumps(figure)


def _trial(number: int, config: dict[str, object], median_us: float) -> object:
    from datetime import datetime, timezone

    from tuner import db
    from tuner.results import Status

    return db.MeasurementRecord(
        id=number + 1, study_id=1, role="trial", round_id=None, candidate="config", trial_number=number,
        config_json=json.dumps(config), status=Status.OK, reason=None, errors_json="{}", kernels_json="[]",
        median_us=median_us, p20_us=median_us, p80_us=median_us, mean_us=median_us, min_us=median_us,
        max_us=median_us, n_samples=3, timer="cupti", build_s=None, verify_s=None, measure_s=None, worker=None,
        created_at=datetime.now(timezone.utc))


def test_small_sweeps_get_ticks_at_whole_trials_and_at_the_parameters_own_values() -> None:
    """A block size swept over 2/4/8 is ticked at 2, 4 and 8 (not at 2.5 or 6) on a log axis, a sweep of three trials at
    whole trial numbers, and the µs title of a parameter panel makes room for its tick labels."""
    from tuner.api.ui.plots import parameter_figures, trials_figure

    trials = [_trial(k, {"block": b, "mode": "ok"}, us) for k, (b, us) in enumerate([(2, 9000.0), (4, 21000.0),
                                                                                        (8, 15000.0)])]
    ((name, figure), (_, mode)) = parameter_figures(trials, ["block", "mode"])  # type: ignore[arg-type]
    xaxis, yaxis = figure["layout"]["xaxis"], figure["layout"]["yaxis"]
    assert name == "block" and xaxis["tickvals"] == [2.0, 4.0, 8.0] and xaxis["ticktext"] == ["2", "4", "8"]
    assert xaxis["type"] == "log"  # powers of two, evenly spaced (32 and 64 crowded each other near 256)
    assert yaxis["automargin"] is True and "tickvals" not in mode["layout"]["xaxis"]  # a category axis: its own
    timeline = trials_figure(trials)["layout"]["xaxis"]  # type: ignore[arg-type]
    assert timeline["dtick"] == 1 and timeline["tickformat"] == "d"


def test_the_distribution_legend_sits_under_the_curves() -> None:
    from tuner.api.ui.plots import ecdf_figure

    layout = ecdf_figure([("#1", [_trial(0, {}, 10.0), _trial(1, {}, 20.0)]),  # type: ignore[list-item]
                          ("#2", [_trial(2, {}, 278.0)])])["layout"]
    assert layout["legend"]["y"] < 0 and layout["yaxis"]["range"][1] > 1
    assert 10 ** layout["xaxis"]["range"][1] > 278.0 * 1.1 and 10 ** layout["xaxis"]["range"][0] < 10.0 / 1.1


def test_final_round_values_sit_at_the_bars_base_away_from_the_whiskers() -> None:
    """A bar's value is written inside it from its base (at its end it met the p20-p80 whisker); a bar too short
    to hold it (a comparator 400x faster) gets it past its end. tests/ui/test_browser.py screenshots the page."""
    from dataclasses import replace

    from tuner.api.ui.plots import final_figure

    rows = [replace(_trial(k, {"block": k}, us), role="final", round_id="r", trial_number=None,  # type: ignore[type-var]
                    p20_us=us * 0.97, p80_us=us * 1.05) for k, us in enumerate([1063.0, 2637.0, 4697.0, 10.1])]
    trace = final_figure(rows, best_id=1)["data"][0]  # type: ignore[arg-type]
    assert trace["x"] == [4697.0, 2637.0, 1063.0, 10.1]  # slowest first: drawn at the bottom, the fastest on top
    assert trace["textposition"] == ["inside", "inside", "inside", "outside"]
    assert trace["insidetextanchor"] == "start" and trace["error_x"]["array"][0] > 0


def test_config_values_are_written_as_the_live_updates_write_them() -> None:
    """The job page wrote ``hints=False`` when it loaded and ``hints=false`` after a live update (ui.js)."""
    from tuner.api.ui.pages import TEMPLATES
    from tuner.api.ui.plots import param_value

    assert [param_value(v) for v in (True, False, None, 64, "hq", 1.5)] == ["true", "false", "null", "64", "hq", "1.5"]
    macro = TEMPLATES.env.from_string('{% from "_macros.html" import config %}{{ config(c) }}')
    assert macro.render(c={"hints": False, "BLOCK": 64, "layout": "tma"}) == (
        '<code class="cfg">hints=false, BLOCK=64, layout=tma</code>')
