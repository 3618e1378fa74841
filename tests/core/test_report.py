"""Rendering of reports: rows measured by an older template version are labelled as such."""

from __future__ import annotations

from tuner.frozen import Config, Shape
from tuner.report import Report, ReportRow, render_markdown


def _row(workload: str, version: str) -> ReportRow:
    return ReportRow(
        workload=workload, shape=Shape(n=1), device="cuda:GPU", timer="cupti", best_config=Config(BLOCK=64),
        best_us=10.0, best_spread=(9.0, 11.0), default_us=20.0, lines=(), roofline_pct=None, trials=3,
        failed=0, search_s=None, best_errors={"y": 1e-4}, version=version,
    )


def test_rows_of_the_current_version_keep_the_plain_title() -> None:
    text = render_markdown(Report("t", "2", (_row("w1", "2"),)))
    assert text.startswith("# t (template version 2)\n") and "| w1 |" in text


def test_rows_of_older_versions_say_which_version_measured_them() -> None:
    text = render_markdown(Report("t", "2", (_row("w1", "1"), _row("w2", "2"))))
    assert text.startswith("# t (measured with template version 1, 2; the code is now version 2)\n")
    assert "| w1 (v1) |" in text and "| w2 (v2) |" in text


def test_errors_table_lists_every_output_of_the_best_config() -> None:
    text = render_markdown(Report("t", "1", (_row("w1", "1"),)), errors=True)
    assert "### Relative L2 error per output" in text and "| w1 | best config | 1.0e-04 |" in text
