"""Rendering of reports: version labels, the error and per-kernel tables."""

from __future__ import annotations

import dataclasses

import pytest

from tests.fixtures.studies import study_fields
from tuner import db
from tuner.driver.study import new_measurement
from tuner.frozen import Config, Shape
from tuner.report.markdown import Report, ReportRow, collect, kernel_label, render_markdown, tensor_peak_flops
from tuner.results import (
    MeasureResult,
    SampleSummary,
    Status,
    Timer,
    merge_unmeasured_comparators,
    merged_label,
    reason_line,
)


def _row(workload: str, version: str) -> ReportRow:
    return ReportRow(
        workload=workload, shape=Shape(n=1), device="cuda:GPU", timer="cupti", best_config=Config(BLOCK=64),
        best_us=10.0, best_spread=(9.0, 11.0), default_us=20.0, lines=(), roofline_pct=None, trials=3,
        failed=0, search_s=None, best_errors={"y": 1e-4}, version=version,
    )


def test_a_ceiling_is_a_percentage_on_a_device_and_none_on_the_cpu() -> None:
    import dataclasses

    from tuner.report.markdown import Line

    ceiling = Line("ceiling-block512", 8.0, ceiling=True)
    on_gpu = dataclasses.replace(_row("w1", "2"), ceiling=ceiling)
    assert on_gpu.ceiling_pct == 80.0
    assert dataclasses.replace(on_gpu, timer="cpu-wall").ceiling_pct is None  # the interpreter is no memory system


def test_rows_of_the_current_version_keep_the_plain_title() -> None:
    text = render_markdown(Report("t", "2", (_row("w1", "2"),)))
    assert text.startswith("# t (template version 2)\n") and "| w1 |" in text


def test_rows_of_older_versions_say_which_version_measured_them() -> None:
    text = render_markdown(Report("t", "2", (_row("w1", "1"), _row("w2", "2"))))
    assert text.startswith("# t (measured with template version 1, 2; the code is now version 2)\n")
    assert "| w1 (v1) |" in text and "| w2 (v2) |" in text


def test_the_geometric_mean_has_three_decimals() -> None:
    # default / best = 2.0 and 1.69: geomean 1.8385, which two decimals would print as a round 1.84x
    rows = (_row("w1", "1"), dataclasses.replace(_row("w2", "1"), default_us=16.9))
    assert "**1.838x**" in render_markdown(Report("t", "1", rows))


def test_shapes_outside_the_workloads_have_their_own_geometric_mean() -> None:
    """Other shapes someone tuned (labelled by shape key) do not move the workloads' mean (the chunk cumsum
    report's headline changed when four unseen shapes were tuned into its store); contracts keep theirs."""
    other = dataclasses.replace(_row("n=7", "1"), shape=Shape(n=7), default_us=11.0)
    contract = dataclasses.replace(_row("w2 @ dtype=float32", "1"), default_us=40.0)
    text = render_markdown(Report("t", "1", (_row("w1", "1"), other, contract)))
    assert "| **geometric mean** |  |  |  | **2.000x**" in text
    assert "| **geometric mean** @ dtype=float32 |  |  |  | **4.000x**" in text
    assert "| **geometric mean**, shapes not among the workloads |  |  |  | **1.100x**" in text
    assert text.index("@ dtype=float32 |  |") < text.index("not among the workloads |")
    assert _row("w1", "1").named and not other.named and contract.named
    # shapes alone (no workload tuned, as the README's first command): their mean is the geometric mean
    alone = render_markdown(Report("t", "1", (other,)))
    assert "| **geometric mean** |  |  |  | **1.100x**" in alone and "workloads" not in alone


def test_the_means_are_given_again_with_each_best_at_its_verification() -> None:
    """With every row's best re-measured by `tuner verify`, a second mean row puts each best at its
    verification's median (here 12.5 µs where 10 were stored: default / best 2.0 → 1.6); with a row not
    verified, none (a mean of stored and re-measured bests would be neither)."""
    from datetime import datetime, timezone

    from tuner.store import VerificationRecord

    def verified(row: ReportRow, median_us: float) -> ReportRow:
        check = VerificationRecord(
            id=1, study_id=1, config_json=row.best_config.to_json(), stored_us=10.0, median_us=median_us,  # type: ignore[union-attr]
            low_us=median_us, high_us=median_us, drift=median_us / 10.0 - 1, tolerance=0.03, flagged=True,
            processes=2, figures_json="[]", device_kind="cuda", device_name="GPU", fingerprint_hash="f",
            fingerprint_json="{}", worker=None, created_at=datetime.now(timezone.utc))
        return dataclasses.replace(row, verification=check)

    rows = (verified(_row("w1", "1"), 12.5), verified(_row("w2", "1"), 12.5))
    text = render_markdown(Report("t", "1", rows))
    assert "| **geometric mean** |  |  |  | **2.000x**" in text
    assert "| **geometric mean**, each best at its `tuner verify` median |  |  |  | **1.600x**" in text
    text = render_markdown(Report("t", "1", (rows[0], _row("w2", "1"))))
    assert "**geometric mean** |" in text and "each best at its `tuner verify` median" not in text


def test_errors_table_lists_every_output_of_the_best_config() -> None:
    text = render_markdown(Report("t", "1", (_row("w1", "1"),)), errors=True)
    assert "### Relative L2 error per output" in text and "| w1 | best config | 1.0e-04 |" in text


def test_a_reason_cut_for_a_cell_says_it_was_cut() -> None:
    """Tables (tune's final round, verify, the report's notes, history, the study page) show a reason's first
    line; cut, it ends in '…' — 80 characters of mamba_ssm's unavailable reason once read "named 'mam"."""
    unavailable = "unavailable: mamba_ssm not importable: ModuleNotFoundError: No module named 'mamba_ssm'"
    assert reason_line(unavailable) == unavailable  # 87 characters: within the default 120
    assert reason_line(unavailable, 80) == unavailable[:79] + "…" and len(reason_line(unavailable, 80)) == 80
    assert reason_line("  \nRuntimeError: boom\nTraceback …") == "RuntimeError: boom"
    assert reason_line(None) == reason_line("") == reason_line(" \n ") == ""
    assert reason_line("x" * 30 + " " * 10 + "y", 35) == "x" * 30 + "…"  # no blank before the ellipsis


def test_comparators_unmeasured_for_one_reason_are_one_row() -> None:
    """tune's final round and verify's processes: a host without mamba_ssm listed its twelve unavailable
    comparators as twelve identical rows; they are one, where the first was. Measured rows, and comparators
    that failed for another reason, stay rows of their own."""
    gone = "unavailable: mamba_ssm not importable"
    rows = [("config", "OK", None), ("comparator:a", "INVALID", gone), ("default", "OK", None),
            ("comparator:b", "INVALID", gone), ("comparator:c", "RUNTIME_ERROR", "boom"),
            ("comparator:d", "OK", None), ("comparator:e", "INVALID", gone), ("comparator:f", "OK", None)]
    merged = merge_unmeasured_comparators(rows, label=lambda r: r[0], status=lambda r: r[1], reason=lambda r: r[2])
    assert [(row[0], labels) for row, labels in merged] == [
        ("config", ["config"]), ("comparator:a", ["comparator:a", "comparator:b", "comparator:e"]),
        ("default", ["default"]), ("comparator:c", ["comparator:c"]), ("comparator:d", ["comparator:d"]),
        ("comparator:f", ["comparator:f"])]
    assert merged_label(merged[1][1]) == "3 comparators: a, b, e"
    assert merged_label(merged[1][1], names=False) == "3 comparators"
    assert merged_label(["comparator:c"]) == "comparator:c"


def test_kernel_labels_drop_types_namespaces_templates_and_parameters() -> None:
    assert kernel_label("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>,"
                        " std::array<char*, 1> >(int, at::native::FillFunctor<float>, std::array<char*, 1>)") \
        == "vectorized_elementwise_kernel"
    assert kernel_label("chunk_values_kernel") == "chunk_values_kernel"
    assert kernel_label("x" * 60, width=10) == "x" * 9 + "…"


def test_kernel_breakdown_goes_from_a_measurement_to_the_report(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A final round stored with per-kernel times (as the CUPTI timer records them) is rendered longest
    first for the best config and the comparator line; without ``kernels`` the table is left out."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    config = Config(block_h=8)
    summary = SampleSummary.of([6.0, 6.5, 7.0])
    best = MeasureResult(Status.OK, config, summary, timer=Timer.CUPTI,
                         kernels={"scan_kernel": 1.5, "void ns::load_kernel<8>(float*)": 4.5})
    other = MeasureResult(Status.OK, Config(), SampleSummary.of([9.0]), timer=Timer.CUPTI,
                          kernels={"_chunk_cumsum_fwd_kernel": 9.0})
    with store.session() as session:
        study = db.get_or_create_study(session, **study_fields())
    for result, candidate in ((best, "config"), (other, "comparator:mamba_ssm")):
        store.record_measurement(new_measurement(result, study_id=study.id, role="final", candidate=candidate,
                                                 round_id="r"))
    report = collect(store, "mamba2_chunk_cumsum")
    text = render_markdown(report, kernels=True)
    assert "### Device time per kernel" in text
    assert "| best config | 6.50 | load_kernel 4.50; scan_kernel 1.50 |" in text
    assert "| mamba_ssm | 9.00 | _chunk_cumsum_fwd_kernel 9.00 |" in text
    assert "Device time per kernel" not in render_markdown(report)


def test_a_shape_tuned_under_two_fingerprints_shows_the_study_that_published_last(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Three studies of one shape (other drivers: other fingerprints). The row is the study that published a
    best last, whichever was created last; a final round that published nothing (a sweep stopped in its final
    round, or nothing passed) does not take the row; with no best anywhere, the newest study."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    with store.session() as session:
        older = db.get_or_create_study(session, **study_fields(driver="570"))
        newer = db.get_or_create_study(session, **study_fields(driver="580"))
        newest = db.get_or_create_study(session, **study_fields(driver="590"))

    def final_round(study_id: int, us: float, round_id: str, publish: bool = True) -> None:
        result = MeasureResult(Status.OK, Config(block_h=8), SampleSummary.of([us]), timer=Timer.CUPTI)
        m = store.record_measurement(new_measurement(result, study_id=study_id, role="final", candidate="config",
                                                     round_id=round_id))
        if publish:
            store.publish_best(study_id=study_id, measurement_id=m.id)

    final_round(newest.id, 9.0, "x", publish=False)
    (row,) = collect(store, "mamba2_chunk_cumsum").rows
    assert row.best_us == 9.0  # nothing published anywhere: the newest study
    final_round(newer.id, 7.0, "a")
    final_round(older.id, 5.0, "b")  # the older study published last
    (row,) = collect(store, "mamba2_chunk_cumsum").rows
    assert row.best_us == 5.0
    final_round(newest.id, 4.0, "y", publish=False)  # a newer final round that published nothing
    (row,) = collect(store, "mamba2_chunk_cumsum").rows
    assert row.best_us == 5.0
    final_round(newer.id, 6.0, "c")
    (row,) = collect(store, "mamba2_chunk_cumsum").rows
    assert row.best_us == 6.0


def test_a_later_round_that_published_nothing_does_not_replace_the_published_rounds_figures(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A job cancelled while its final round ran stores the round and publishes nothing: the report showed
    that round's figures (its fastest config, its ratios) beside a lookup serving the published one. The row
    shows the round that published the best; a study with no best at all says so and stays out of the means."""
    from tuner.report.markdown import render_markdown

    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    with store.session() as session:
        study = db.get_or_create_study(session, **study_fields())
        alone = db.get_or_create_study(session, **study_fields(S=2048))

    def final_round(study_id: int, us: float, block_h: int, round_id: str, publish: bool) -> None:
        result = MeasureResult(Status.OK, Config(block_h=block_h), SampleSummary.of([us]), timer=Timer.CUPTI)
        m = store.record_measurement(new_measurement(result, study_id=study_id, role="final", candidate="config",
                                                     round_id=round_id))
        if publish:
            store.publish_best(study_id=study_id, measurement_id=m.id)

    final_round(study.id, 6.0, 8, "published", publish=True)
    final_round(study.id, 4.0, 4, "cancelled", publish=False)  # later and faster, never published
    final_round(alone.id, 3.0, 2, "stopped", publish=False)
    rows = {int(r.shape["S"]): r for r in collect(store, "mamba2_chunk_cumsum").rows}
    row, unpublished = rows[4096], rows[2048]
    assert (row.best_us, row.best_config, row.published) == (6.0, Config(block_h=8), True)
    assert unpublished.best_us == 3.0 and unpublished.unpublished and not row.unpublished
    text = render_markdown(collect(store, "mamba2_chunk_cumsum"))
    assert text.count("not published") == 1 and "3.00" in text


def test_tensor_peak_column_for_a_template_that_counts_flops(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The MIMO backward counts its matmul flops: on an H200 its row gets "% tensor peak" = flops / best
    time / 989.4 TFLOP/s; a device not in the peak table gets "–"; a template without flops, no column."""
    from tuner import registry

    template = registry.get("mamba3_mimo_bwd")
    shape = template.workload("mimo-n128-p64-r4")
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    for device, us in (("NVIDIA H200", 3616.6), ("Some GPU", 5000.0)):
        fields = study_fields(template=template.name, version=template.version, device_name=device)
        fields.update(shape_key=shape.key(), shape_json=shape.to_json())
        with store.session() as session:
            study = db.get_or_create_study(session, **fields)
        result = MeasureResult(Status.OK, Config(template.space().default), SampleSummary.of([us]),
                               timer=Timer.CUPTI)
        store.record_measurement(new_measurement(result, study_id=study.id, role="final", candidate="config",
                                                 round_id=device))
    rows = {r.device: r for r in collect(store, template.name).rows}
    h200 = rows["cuda:NVIDIA H200"]
    assert h200.tensor_pct == pytest.approx(100.0 * template.tensor_flops(shape) / 3616.6e-6 / 989.4e12)
    assert 1.0 < h200.tensor_pct < 5.0 and rows["cuda:Some GPU"].tensor_pct is None
    text = render_markdown(collect(store, template.name))
    assert "% tensor peak" in text and f"| {h200.tensor_pct:.1f}% |" in text
    assert "% tensor peak" not in render_markdown(Report("t", "1", (_row("w", "1"),)))
    assert tensor_peak_flops("NVIDIA H100 PCIe") == 756e12 and tensor_peak_flops("NVIDIA H200 NVL") == 835e12
    assert tensor_peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12 and tensor_peak_flops("Some GPU") is None


def _fingerprint(bw: float, clock: int, driver: str = "580") -> dict[str, object]:
    return {"kind": "cuda", "device_name": "GPU", "driver": driver, "runtime": "13.0",
            "libraries": {"torch": "2.11"}, "info": {"l2_bytes": 100, "copy_bw_bytes_per_s": bw,
                                                      "sm_clock_mhz_at_start": clock}}


def test_runs_of_one_environment_share_its_table_with_the_measured_figures_as_ranges() -> None:
    fps = (_fingerprint(4.1e12, 1980), _fingerprint(4.2e12, 1980), _fingerprint(4.15e12, 1980),
           _fingerprint(4.2e12, 1980))  # the last one is the second again: one run, counted once
    text = render_markdown(Report("t", "2", (_row("w1", "2"),), fps))
    env = text[text.index("## Environment"):]
    assert env.count("| field | value |") == 1
    assert "| copy_bw_bytes_per_s | 4.1e+12–4.2e+12 (3 runs) |" in env
    assert "| sm_clock_mhz_at_start | 1980 |" in env and "| l2_bytes | 100 |" in env and "| torch | 2.11 |" in env


def test_another_driver_is_another_environment_table() -> None:
    fps = (_fingerprint(4.1e12, 1980), _fingerprint(4.2e12, 1755, driver="575"))
    env = render_markdown(Report("t", "2", (_row("w1", "2"),), fps)).split("## Environment")[1]
    assert env.count("| field | value |") == 2
    assert "| copy_bw_bytes_per_s | 4100000000000.0 |" in env and "| sm_clock_mhz_at_start | 1755 |" in env


def test_a_tie_has_no_colour() -> None:
    """A best that is the default config itself read "1.00x 🔴", as if the tuned config were slower."""
    from tuner.report.markdown import _gm_ratio, _ratio

    assert (_ratio(2.0, 2.0), _ratio(3.0, 2.0), _ratio(2.0, 3.0)) == ("1.00x", "1.50x 🟢", "0.67x 🔴")
    assert _gm_ratio([(2.0, 2.0)]) == "**1.000x**" and _gm_ratio([(4.0, 2.0)]) == "**2.000x** 🟢"
