"""Markdown reports from the store: per workload, the best config against the incumbent and comparators.

Every figure in a row comes from one final round (measured interleaved in the same process run), so the
ratios are same-run ratios. Ratios are ``other / best``: above 1 means the tuned config is faster (🟢); exactly 1 (the
best is that config) has no mark.

Comparator lines are the libraries as their users call them, plus contract variants (labelled as such); the
"strongest line" is the fastest of all of them, "strongest as users call it" the fastest of the former. A
ceiling line (a kernel that only moves the template's minimum bytes) is no competitor: it gives the
"% of the elementwise kernel" column, beside the percentage of the fingerprint's 2 GiB copy bandwidth.
Rows of a shape that is a workload under a comparator's own contract (e.g. fp32 ``dt_out``) are labelled
``<workload> @ dim=value``: there the template runs on the comparator's contract, like for like.
"% roofline" is the template's minimum bytes over the best time, against the fingerprint's copy bandwidth;
"% tensor peak" (templates that count matmul flops: ``tensor_flops``, a nominal count that need not follow the
best config's tiling) is those over the best time, against the device's dense 16-bit tensor-core peak
(:data:`TENSOR_PEAKS`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from tuner import registry
from tuner.frozen import Config, Shape
from tuner.keys import MEASURED_INFO
from tuner.results import COMPARATOR_PREFIX, DEFAULT_LABEL, Status, reason_line
from tuner.store import MeasurementRecord, StudyRecord, TuningStore, VerificationRecord
from tuner.store.entries import disproved_by_study, round_winner
from tuner.store.records import active_seconds, current_studies
from tuner.template import Comparator, KernelTemplate

GREEN, RED = "🟢", "🔴"


@dataclass(frozen=True)
class Line:
    """One comparator line of a row: its best member's time, or why it has none."""

    name: str
    median_us: float | None
    member: str | None = None  # which comparator of the group gave the time
    note: str | None = None
    errors: dict[str, float] = field(default_factory=dict)  # relative error per output of that member
    kernels: dict[str, float] = field(default_factory=dict)  # median µs per kernel of that member
    doc: str = ""  # what the line runs (its timed member's doc)
    variant: str | None = None  # how the line departs from the library as users call it; None: as users do
    ceiling: bool = False  # a kernel moving the template's minimum bytes: the measured memory ceiling
    bytes_moved: int | None = None  # bytes the line's contract moves at the row's shape

    @property
    def as_users_call_it(self) -> bool:
        return self.variant is None and not self.ceiling


@dataclass(frozen=True)
class ReportRow:
    workload: str
    shape: Shape
    device: str
    timer: str | None
    best_config: Config | None
    best_us: float | None
    best_spread: tuple[float, float] | None
    default_us: float | None
    lines: tuple[Line, ...]
    roofline_pct: float | None
    trials: int
    failed: int
    search_s: float | None
    best_errors: dict[str, float] = field(default_factory=dict)  # relative error per output, final round
    version: str = ""  # the template version the row's study measured
    best_kernels: dict[str, float] = field(default_factory=dict)  # median µs per kernel, final round
    ceiling: Line | None = None  # the measured memory ceiling of the same round (not among ``lines``)
    bytes_moved: int | None = None  # the template's minimum bytes at the row's shape
    verification: VerificationRecord | None = None  # the latest `tuner verify` of the row's study
    tensor_pct: float | None = None  # template flops / best time over the device's dense 16-bit tensor peak
    published: bool = False  # the row's best config is its study's published best (what is served)
    unpublished: bool = False  # no config of the row's study is published (its round stopped before it published)

    @property
    def named(self) -> bool:
        """Whether the row is one of the template's workloads (or one under a comparator's contract), not
        another shape someone tuned (labelled by its shape key)."""
        return self.workload != self.shape.key()

    @property
    def ceiling_pct(self) -> float | None:
        """Percent of the ceiling kernel's speed the best config reaches (ceiling µs / best µs); None on the
        CPU (``cpu-wall``), where the ceiling runs under Triton's interpreter and says nothing of memory: a
        TileLang row there read "525% of" it."""
        if self.ceiling is None or not self.ceiling.median_us or not self.best_us or self.timer == "cpu-wall":
            return None
        return 100.0 * self.ceiling.median_us / self.best_us

    @property
    def strongest(self) -> Line | None:
        """The fastest comparator line of the row (contract variants included)."""
        return min((ln for ln in self.lines if ln.median_us), key=lambda ln: ln.median_us or math.inf, default=None)

    @property
    def strongest_as_users_call_it(self) -> Line | None:
        """The fastest line that runs a library as its users call it."""
        timed = [ln for ln in self.lines if ln.median_us and ln.as_users_call_it]
        return min(timed, key=lambda ln: ln.median_us or math.inf, default=None)


@dataclass(frozen=True)
class Report:
    template: str
    version: str
    rows: tuple[ReportRow, ...]
    fingerprints: tuple[dict[str, object], ...] = field(default_factory=tuple)


def collect(store: TuningStore, template_name: str, *, device_kind: str | None = None) -> Report:
    """One row per (shape, device) of a template, from the study that shows it
    (:func:`tuner.store.records.current_studies`: the last to publish a best) and its latest final round."""
    template = registry.get(template_name)
    studies = store.list_studies(template=template_name, device_kind=device_kind)
    bests = store.list_best(template=template_name, device_kind=device_kind)
    latest = current_studies(studies, bests)
    published = {b.study_id: json.loads(b.config_json) for b in bests}
    best_rows = {b.study_id: b.measurement_id for b in bests}
    rows = []
    fingerprints: dict[str, dict[str, object]] = {}
    checks = store.latest_verifications(study_ids=[st.id for st in latest.values()])
    disproved = disproved_by_study(store, [st.id for st in latest.values()])
    for st in sorted(latest.values(), key=lambda s: (s.device_name, s.shape_key)):
        fingerprint = json.loads(st.fingerprint_json)
        fingerprints[st.fingerprint_hash] = fingerprint
        served_config = Config(published[st.id]) if st.id in published else None
        row = _row(store, template, st, fingerprint, disproved[st.id], served_config, best_rows.get(st.id))
        check = checks.get(st.id)  # only a verification of the config the row shows as best
        verified = check.of_config(row.best_config.to_dict()) if check and row.best_config else None
        served = row.best_config is not None and published.get(st.id) == row.best_config.to_dict()
        rows.append(dataclasses.replace(row, verification=verified, published=served,
                                        unpublished=st.id not in published))
    return Report(template.name, template.version, tuple(rows), tuple(fingerprints.values()))


def _row(store: TuningStore, template: KernelTemplate, st: StudyRecord, fingerprint: dict[str, object],
         disproved: Collection[Config], published: Config | None = None,
         published_row: int | None = None) -> ReportRow:
    shape = Shape.from_json(st.shape_json)
    final = _shown_round(store, st.id, published_row)
    trials = store.list_measurements(study_id=st.id, role="trial")
    measured = [t for t in trials if t.status != Status.INVALID.value]
    failed = sum(1 for t in measured if t.status != Status.OK.value)
    search_s = active_seconds([t.created_at for t in measured])
    best = round_winner(final, disproved, published)
    default = next((m for m in final if m.candidate == DEFAULT_LABEL and m.status == Status.OK.value), None)
    if best is not None and best.candidate == DEFAULT_LABEL:
        default = best
    comps = {c.name: c for c in template.comparators()}
    lines: dict[str, list[MeasurementRecord]] = {}
    for m in final:
        if m.candidate.startswith(COMPARATOR_PREFIX):
            name = m.candidate[len(COMPARATOR_PREFIX):]
            line = comps[name].line if name in comps else name
            lines.setdefault(line, []).append(m)
    built = [_line(name, members, comps, template, shape) for name, members in sorted(lines.items())]
    info = fingerprint.get("info")
    bw = info.get("copy_bw_bytes_per_s") if isinstance(info, dict) else None
    roofline = None
    if best is not None and best.median_us and bw:
        roofline = 100.0 * template.bytes_moved(shape) / (best.median_us * 1e-6) / float(bw)
    peak, flops = tensor_peak_flops(st.device_name), _flops(template, shape)
    tensor = 100.0 * flops / (best.median_us * 1e-6) / peak if best and best.median_us and peak and flops else None
    return ReportRow(
        workload=_row_label(template, shape),
        shape=shape,
        device=f"{st.device_kind}:{st.device_name}",
        timer=best.timer if best else None,
        best_config=Config.from_json(best.config_json) if best else None,
        best_us=best.median_us if best else None,
        best_spread=(best.p20_us, best.p80_us) if best and best.p20_us is not None and best.p80_us is not None
        else None,
        default_us=default.median_us if default else None,
        lines=tuple(ln for ln in built if not ln.ceiling),
        roofline_pct=roofline,
        tensor_pct=tensor,
        trials=len(measured),
        failed=failed,
        search_s=search_s,
        best_errors=best.errors if best else {},
        version=st.template_version,
        best_kernels=best.kernels if best else {},
        ceiling=_fastest_line([ln for ln in built if ln.ceiling]),
        bytes_moved=_bytes_moved(template, shape),
    )


# Dense 16-bit (bf16/fp16) tensor-core peaks in FLOP/s from NVIDIA's data sheets (without sparsity), by a
# substring of the device name, the first that matches: the NVL and PCIe parts before the SXM ones. A device
# not listed gets no "% tensor peak".
TENSOR_PEAKS: tuple[tuple[str, float], ...] = (
    ("H200 NVL", 835e12), ("H100 NVL", 835e12), ("H100 PCIe", 756e12), ("H200", 989.4e12), ("H100", 989.4e12),
    ("A100", 312e12),
)


def tensor_peak_flops(device_name: str) -> float | None:
    """The dense 16-bit tensor-core peak of a device (FLOP/s), or None for a device not in TENSOR_PEAKS."""
    return next((peak for part, peak in TENSOR_PEAKS if part in device_name), None)


def _flops(template: KernelTemplate, shape: Shape) -> int:
    """The template's matmul flops at a stored shape (0: none, or a shape it cannot size)."""
    try:
        return template.tensor_flops(shape)
    except (KeyError, ValueError):
        return 0


def _bytes_moved(template: KernelTemplate, shape: Shape) -> int | None:
    """The template's minimum bytes at a stored shape; None for a shape the current template cannot size (a
    study of an older version that lacks a dim)."""
    try:
        return template.bytes_moved(shape)
    except (KeyError, ValueError):
        return None


def _row_label(template: KernelTemplate, shape: Shape) -> str:
    """The workload's name; for a workload's shape under a comparator's contract, ``<workload> @ dim=value``;
    else the shape's key."""
    name = template.workload_name(shape)
    if name:
        return name
    for comp in template.comparators():
        if not comp.contract:
            continue
        for w in template.workloads:
            base = template.make_shape(w.shape)
            if base != shape and comp.contract_shape(base) == shape:
                return f"{w.name} @ " + ",".join(f"{k}={v}" for k, v in sorted(comp.contract.items()))
    return shape.key()


def _fastest_line(lines: Sequence[Line]) -> Line | None:
    return min((ln for ln in lines if ln.median_us), key=lambda ln: ln.median_us or math.inf, default=None)


def _line(
    name: str, members: Sequence[MeasurementRecord], comps: Mapping[str, Comparator], template: KernelTemplate,
    shape: Shape,
) -> Line:
    """One line from its members' measurements: the fastest OK member's figures, what it runs and its bytes.
    Members no longer among the template's comparators are shown by name alone."""
    known = [comps[n] for n in (m.candidate[len(COMPARATOR_PREFIX):] for m in members) if n in comps]
    first = known[0] if known else None
    line = Line(name, None, doc=first.doc if first else "", variant=first.variant if first else None,
                ceiling=first.ceiling if first else False,
                bytes_moved=_bytes_moved(template, first.contract_shape(shape)) if first else None)
    ok = [m for m in members if m.status == Status.OK.value and m.median_us is not None]
    if not ok:
        reasons = "; ".join(sorted({f"{m.status}: {reason_line(m.reason)}" for m in members}))
        return dataclasses.replace(line, note=reasons)
    best = min(ok, key=lambda m: m.median_us or math.inf)
    member = best.candidate[len(COMPARATOR_PREFIX):]
    return dataclasses.replace(line, median_us=best.median_us, member=member, errors=best.errors,
                               kernels=best.kernels, doc=comps[member].doc if member in comps else line.doc)


def _ratio(other: float | None, best: float | None) -> str:
    if not other or not best:
        return "–"
    r = other / best
    return f"{r:.2f}x{_mark(r)}"


def _us(value: float | None) -> str:
    return "–" if value is None else (f"{value:.2f}" if value < 100 else f"{value:.1f}")


def _shown_round(store: TuningStore, study_id: int, published_row: int | None) -> list[MeasurementRecord]:
    """The final round a row shows: the one that published the study's best (``published_row``: the best's
    measurement), not a later round that published nothing (a job cancelled while its round ran: its figures
    are not what the lookup serves); the latest round when no best is published."""
    if published_row is not None:
        row = store.get_measurement(measurement_id=published_row)
        if row is not None and row.role == "final" and row.round_id is not None:
            return store.list_measurements(study_id=study_id, role="final", round_id=row.round_id)
    return store.latest_round(study_id=study_id)


def geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def render_markdown(report: Report, *, errors: bool = False, kernels: bool = False) -> str:
    """The report as markdown: one table per device, a geometric-mean row, the environment.

    ``errors`` adds, per device, a table of each output's relative L2 error (worst over the check seeds of
    the final round) for the best config and every comparator line that was timed; ``kernels`` a table
    of their device time per kernel (timers that see kernels only: CUPTI).
    """
    versions = sorted({r.version for r in report.rows} - {""}) or [report.version]
    if versions == [report.version]:
        out = [f"# {report.template} (template version {report.version})", ""]
    else:  # rows measured by older code: say so, and tag each row with its version
        out = [f"# {report.template} (measured with template version {', '.join(versions)}; "
               f"the code is now version {report.version})", ""]
    if not report.rows:
        out.append("No studies in the store for this template yet.")
        return "\n".join(out) + "\n"
    for device in sorted({r.device for r in report.rows}):
        rows = [r for r in report.rows if r.device == device]
        # Lines that never ran on this device get a note instead of empty columns.
        line_names = sorted({ln.name for r in rows for ln in r.lines if ln.median_us is not None})
        silent = sorted({f"{ln.name}: {ln.note}" for r in rows for ln in r.lines if ln.name not in line_names})
        timer = next((r.timer for r in rows if r.timer), "?")
        out += [f"## {device} (timer: {timer}; times in µs, median of the final interleaved round)", ""]
        header = ["workload", "best config", "best µs (p20–p80)", "default µs", "default / best"]
        for n in line_names:
            header += [f"{n} µs", f"{n} / best"]
        summary = _SummaryColumns.of(rows)
        header += [*summary.header(), "trials (failed)", "search s"]
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        for r in rows:
            spread = f" ({_us(r.best_spread[0])}–{_us(r.best_spread[1])})" if r.best_spread else ""
            cells = [
                r.workload if len(versions) == 1 else f"{r.workload} (v{r.version})",
                _config_cell(r.best_config),
                _us(r.best_us) + spread + _drift_mark(r),
                _us(r.default_us),
                _ratio(r.default_us, r.best_us),
            ]
            by_name = {ln.name: ln for ln in r.lines}
            for n in line_names:
                ln = by_name.get(n)
                if ln is None or ln.median_us is None:
                    cells += [f"– ({ln.note})" if ln and ln.note else "–", "–"]
                else:
                    member = f" ({ln.member})" if ln.member and ln.member != n else ""
                    cells += [_us(ln.median_us) + member, _ratio(ln.median_us, r.best_us)]
            cells += [
                *summary.cells(r),
                f"{r.trials} ({r.failed})",
                f"{r.search_s:.0f}" if r.search_s is not None else "–",
            ]
            out.append("| " + " | ".join(cells) + " |")
        out += _mean_lines(rows, line_names, summary, ["", ""])
        out.append("")
        out += _lines_legend(rows)
        out += [f"- not measured: {note}" for note in silent]
        if silent:
            out.append("")
        if errors:
            out += _error_table(rows, line_names)
        if kernels:
            out += _kernel_table(rows, line_names)
    out += _environment(report.fingerprints)
    return "\n".join(out) + "\n"


def _error_table(rows: Sequence[ReportRow], line_names: Sequence[str]) -> list[str]:
    """Relative L2 error per output: the best config and each timed comparator line, per workload."""
    names = sorted({k for r in rows for k in r.best_errors} | {k for r in rows for ln in r.lines for k in ln.errors})
    if not names:
        return []
    out = ["### Relative L2 error per output (final round, worst over the check seeds)", "",
           "| workload | candidate | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
    for r in rows:
        entries = [("best config", r.best_errors)] if r.best_errors else []
        entries += [(ln.name, ln.errors) for ln in r.lines if ln.name in line_names and ln.errors]
        for label, errs in entries:
            cells = [f"{errs[n]:.1e}" if n in errs else "–" for n in names]
            out.append(f"| {r.workload} | {label} | " + " | ".join(cells) + " |")
    return [*out, ""]


def _kernel_table(rows: Sequence[ReportRow], line_names: Sequence[str]) -> list[str]:
    """Device time per kernel (median µs per sample), longest first: the best config and each timed
    comparator line, per workload. Empty where no row has a breakdown."""
    entries = []
    for r in rows:
        if r.best_kernels:
            entries.append((r.workload, "best config", r.best_us, r.best_kernels))
        entries += [(r.workload, ln.name, ln.median_us, ln.kernels)
                    for ln in r.lines if ln.name in line_names and ln.kernels]
    if not entries:
        return []
    out = ["### Device time per kernel (final round; median µs per sample, longest first)", "",
           "| workload | candidate | total µs | kernels |", "|---|---|---|---|"]
    for workload, label, total, per_kernel in entries:
        ordered = sorted(per_kernel.items(), key=lambda item: -item[1])
        cell = "; ".join(f"{kernel_label(name)} {_us(us)}" for name, us in ordered)
        out.append(f"| {workload} | {label} | {_us(total)} | {cell} |")
    return [*out, ""]


def kernel_label(name: str, width: int = 48) -> str:
    """A short name for a kernel: C++ return type, namespaces, template arguments and parameter list
    dropped (``void at::native::f<4, …>(…)`` -> ``f``), at most ``width`` characters."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    depth, kept = 0, []
    for ch in text:  # drop <...> and (...) at any nesting depth
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif depth == 0:
            kept.append(ch)
    short = "".join(kept).rsplit("::", 1)[-1].strip() or name.strip()
    return short if len(short) <= width else short[: width - 1] + "…"


def render_comparison(reports: Sequence[Report], *, title: str | None = None) -> str:
    """Several templates of one operator side by side: per workload and device, the fastest template's
    best config, its ratios against its incumbent and against every comparator line measured in the same
    final round (plus the strongest line per row), and each template's own best."""
    names = [r.template for r in reports]
    out = [f"# {title or ' vs '.join(names)}", ""]
    by_key: dict[tuple[str, str], dict[str, ReportRow]] = {}
    for report in reports:
        for row in report.rows:
            by_key.setdefault((row.device, row.workload), {})[report.template] = row
    if not by_key:
        return "\n".join([*out, "No studies in the store for these templates yet."]) + "\n"
    for device in sorted({d for d, _ in by_key}):
        keys = [k for k in by_key if k[0] == device]
        winners = {k: _fastest(by_key[k]) for k in keys}
        line_names = sorted({ln.name for k in keys for ln in winners[k][1].lines if ln.median_us is not None})
        out += [f"## {device} (times in µs: medians of each template's final interleaved round)", ""]
        header = ["workload", "best template", "best config", "best µs (p20–p80)", "incumbent / best"]
        for n in line_names:
            header += [f"{n} µs", f"{n} / best"]
        summary = _SummaryColumns.of([row for _, row in winners.values()], strongest=True)
        header += [*summary.header(), *[f"{n} best µs" for n in names], "trials (failed), search s"]
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for k in keys:
            name, row = winners[k]
            by_line = {ln.name: ln for ln in row.lines}
            cells = [k[1], name, _config_cell(row.best_config), _us_spread(row), _ratio(row.default_us, row.best_us)]
            for n in line_names:
                ln = by_line.get(n)
                t = ln.median_us if ln else None
                member = f" ({ln.member})" if ln and ln.member and ln.member != n else ""
                cells += [_us(t) + (member if t else ""), _ratio(t, row.best_us)]
            cells += summary.cells(row)
            cells += [_us(by_key[k][n].best_us) if n in by_key[k] else "–" for n in names]
            cells.append("; ".join(
                f"{n}: {r.trials} ({r.failed}), {r.search_s:.0f} s" if r.search_s is not None else f"{n}: {r.trials}"
                for n, r in sorted(by_key[k].items())
            ))
            out.append("| " + " | ".join(cells) + " |")
        out += [*_mean_lines([winners[k][1] for k in keys], line_names, summary, [""] * (len(names) + 1)), ""]
        out += _lines_legend([winners[k][1] for k in keys])
    out += _environment([fp for r in reports for fp in r.fingerprints])
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class _SummaryColumns:
    """The columns after the comparator lines: the strongest line(s) and the ceilings, those that apply.

    "strongest line / best" (every line) is shown where a row has several lines (or ``strongest``), and
    "strongest as users call it / best" beside it where some line is a contract variant; where a ceiling
    kernel was measured, "% of elementwise kernel" (its time / best) and "% of 2 GiB copy" (the
    fingerprint's copy bandwidth) replace the single "% roofline" column."""

    strongest: bool
    users: bool
    ceiling: bool
    tensor: bool = False  # "% tensor peak": the template counts flops and the device's peak is known

    @classmethod
    def of(cls, rows: Sequence[ReportRow], *, strongest: bool = False) -> _SummaryColumns:
        timed = [ln for r in rows for ln in r.lines if ln.median_us]
        several = strongest or len({ln.name for ln in timed}) > 1
        variants = any(not ln.as_users_call_it for ln in timed)
        return cls(several, several and variants, any(r.ceiling is not None for r in rows),
                   any(r.tensor_pct is not None for r in rows))

    def header(self) -> list[str]:
        out = ["strongest line / best"] if self.strongest else []
        out += ["strongest as users call it / best"] if self.users else []
        out += ["% of elementwise kernel", "% of 2 GiB copy"] if self.ceiling else ["% roofline"]
        return out + (["% tensor peak"] if self.tensor else [])

    def cells(self, r: ReportRow) -> list[str]:
        out = [_strongest_cell(r.strongest, r.best_us)] if self.strongest else []
        out += [_strongest_cell(r.strongest_as_users_call_it, r.best_us)] if self.users else []
        if self.ceiling:
            member = f" ({r.ceiling.member})" if r.ceiling and r.ceiling.member else ""
            out.append(f"{r.ceiling_pct:.0f}% of {_us(r.ceiling.median_us)}{member}"
                       if r.ceiling_pct is not None and r.ceiling else "–")
        out.append(f"{r.roofline_pct:.0f}%" if r.roofline_pct is not None else "–")
        if self.tensor:
            out.append(f"{r.tensor_pct:.1f}%" if r.tensor_pct is not None else "–")
        return out

    def means(self, rows: Sequence[ReportRow]) -> list[str]:
        def pairs(pick: Callable[[ReportRow], Line | None]) -> list[tuple[float | None, float | None]]:
            return [((pick(r) or Line("", None)).median_us, r.best_us) for r in rows]

        out = [_gm_ratio(pairs(lambda r: r.strongest))] if self.strongest else []
        out += [_gm_ratio(pairs(lambda r: r.strongest_as_users_call_it))] if self.users else []
        return out + ([""] * ((2 if self.ceiling else 1) + (1 if self.tensor else 0)))


def _mean_lines(
    rows: Sequence[ReportRow], line_names: Sequence[str], summary: _SummaryColumns, trailing: Sequence[str]
) -> list[str]:
    """Geometric-mean rows: one over the workloads, one per comparator contract the rows were measured
    under (``<workload> @ dtype=float32`` rows): a mean across contracts would mix unlike ratios; and one over
    the other shapes tuned (rows labelled by shape key), which would otherwise change the workloads' mean."""
    groups: dict[str | None, list[ReportRow]] = {}
    for r in rows:
        if r.best_config is not None and r.unpublished:
            continue  # a best nobody serves: its ratios are no published figure
        key = None if not r.named else r.workload.split(" @ ", 1)[1] if " @ " in r.workload else ""
        groups.setdefault(key, []).append(r)
    def mean_line(label: str, group: Sequence[ReportRow]) -> str:
        cells = [label, "", "", "", _gm_ratio([(r.default_us, r.best_us) for r in group])]
        for n in line_names:
            pairs = [(next((ln.median_us for ln in r.lines if ln.name == n), None), r.best_us) for r in group]
            cells += ["", _gm_ratio(pairs)]
        return "| " + " | ".join([*cells, *summary.means(group), *trailing]) + " |"

    out = []
    named = any(contract is not None for contract in groups)
    for contract, group in sorted(groups.items(), key=lambda item: (item[0] is None, item[0] or "")):
        label = ("**geometric mean**" + (f" @ {contract}" if contract else "") if contract is not None
                 else "**geometric mean**, shapes not among the workloads" if named else "**geometric mean**")
        out.append(mean_line(label, group))
        # The same means with each best at its latest verification's median (fresh processes, against the
        # lines' figures of the round that published it): a published ratio must survive a re-measurement.
        # Only where every row of the group has one; a row without would mix stored and re-measured bests.
        verified = [dataclasses.replace(r, best_us=r.verification.median_us) for r in group
                    if r.verification is not None and r.verification.median_us]
        if verified and len(verified) == len(group):
            out.append(mean_line(f"{label}, each best at its `tuner verify` median", verified))
    return out


def _strongest_cell(line: Line | None, best_us: float | None) -> str:
    if line is None or not line.median_us:
        return "–"
    member = f" ({line.member})" if line.member and line.member != line.name else ""
    return f"{_ratio(line.median_us, best_us)} {line.name}{member}"


def _lines_legend(rows: Sequence[ReportRow]) -> list[str]:
    """What each line runs, whether it is the library as its users call it, and the bytes it moves per row
    (MB, in the rows' order; the template's own minimum bytes first)."""
    names = sorted({ln.name for r in rows for ln in [*r.lines, *([r.ceiling] if r.ceiling else [])] if ln.doc})
    if not names:
        return []
    out = ["Lines (bytes moved in MB per row, in the table's order):", "",
           "| line | kind | runs (fastest member) | MB moved |", "|---|---|---|---|"]
    template_mb = " / ".join(_mb(r.bytes_moved) for r in rows)
    out.append(f"| best config | the template | the tuned config | {template_mb} |")
    for name in names:
        found = [next((ln for ln in [*r.lines, *([r.ceiling] if r.ceiling else [])] if ln.name == name), None)
                 for r in rows]
        first = next(ln for ln in found if ln is not None)
        kind = "ceiling (no math)" if first.ceiling else ("as users call it" if first.variant is None
                                                           else f"contract variant: {first.variant}")
        docs = sorted({_first_paragraph(ln.doc) for ln in found if ln is not None and ln.doc})
        mb = " / ".join(_mb(ln.bytes_moved) if ln else "–" for ln in found)
        out.append(f"| {name} | {kind} | {'; '.join(docs)} | {mb} |")
    return [*out, ""]


def _first_paragraph(doc: str, width: int = 240) -> str:
    """A doc's first paragraph on one line (table cells hold no line breaks), at most ``width`` characters."""
    text = " ".join(doc.strip().split("\n\n")[0].split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _mb(nbytes: int | None) -> str:
    return "–" if nbytes is None else f"{nbytes / 1e6:.2f}"


def _fastest(rows: dict[str, ReportRow]) -> tuple[str, ReportRow]:
    return min(rows.items(), key=lambda item: item[1].best_us if item[1].best_us is not None else math.inf)


def _config_cell(config: Config | None) -> str:
    return "`" + json.dumps(config.to_dict(), separators=(",", ":")) + "`" if config else "none"


def _us_spread(row: ReportRow) -> str:
    spread = f" ({_us(row.best_spread[0])}–{_us(row.best_spread[1])})" if row.best_spread else ""
    return _us(row.best_us) + spread + _drift_mark(row)


def _drift_mark(row: ReportRow) -> str:
    """A warning after the best's time when its latest verification is flagged; a note when the row's best is
    not what the lookup serves (no config of the study published: its round stopped before it published)."""
    if row.best_config is not None and row.unpublished:
        return " ⚠ not published (not served; left out of the means)"
    v = row.verification
    if v is None or not v.flagged:
        return ""
    if v.wrong_processes:
        return f" ⚠ wrong results in {v.wrong_processes} of {v.processes} processes (verify)"
    if v.drift is None:
        return " ⚠ not reproduced (verify)"
    return f" ⚠ drift {100 * v.drift:+.1f}% (verify)"


def render_verifications(reports: Sequence[Report], *, title: str | None = None) -> str:
    """The latest verification of each row's published best (``tuner verify``): per process the best
    config's median and spread, the comparators' ratios to their stored figures, and the verdict."""
    out = [f"# {title or 'Verifications: ' + ', '.join(r.template for r in reports)}", ""]
    rows = [(rep.template, r) for rep in reports for r in rep.rows if r.verification is not None]
    # a published best that no verification re-measured (a new final round published since): named, so that
    # an empty or short table is not read as "nothing to verify"
    unverified = [f"{rep.template} {r.workload}" + (f" (v{r.version})" if r.version else "")
                  for rep in reports for r in rep.rows if r.verification is None and r.published]
    if unverified:
        out += [f"Served bests not yet re-measured by `tuner verify` ({len(unverified)}): "
                + ", ".join(unverified) + ".", ""]
    if not rows:
        return "\n".join([*out, "No verification recorded for these templates' served bests yet."]) + "\n"
    out += ["| template | workload | verified (UTC) | processes | stored µs | re-measured µs, median (low–high) | "
            "drift | verdict | per process: median (p20–p80) µs | comparators, re-measured / stored (median over "
            "processes) | comparator / best, same process (median over processes) |", "|" + "---|" * 11]
    for template, r in rows:
        v = r.verification
        assert v is not None
        per_process, ratios, speedups = _process_cells(v.figures)
        verdict = ("**flagged**" if v.flagged else "ok") + f" (±{100 * v.tolerance:g}%)"
        drift = f"{100 * v.drift:+.1f}%" if v.drift is not None else "–"
        out.append(
            f"| {template} | {r.workload} | {v.created_at.strftime('%Y-%m-%d %H:%M')} | {v.processes} | "
            f"{_us(v.stored_us)} | {_us(v.median_us)} ({_us(v.low_us)}–{_us(v.high_us)}) | {drift} | {verdict} | "
            f"{per_process} | {ratios} | {speedups} |"
        )
    fingerprints = [json.loads(r.verification.fingerprint_json) for _, r in rows if r.verification is not None]
    return "\n".join([*out, "", *_environment(fingerprints)]) + "\n"


def _process_cells(figures: Sequence[dict[str, object]]) -> tuple[str, str, str]:
    """The best config's figures per process; each comparator's median ratio to its stored figure; and each
    comparator's median over the best config in the same process (the speed-up measured in one run, over the
    processes that measured both)."""
    best: list[str] = []
    ratios: dict[str, list[float]] = {}
    speedups: dict[str, list[float]] = {}
    for process in figures:
        candidates = list(process.get("candidates", []))  # type: ignore[call-overload]
        best_us = next((c.get("median_us") for c in candidates if c.get("label") == "best"), None)
        for c in candidates:
            median, stored = c.get("median_us"), c.get("stored_us")
            if c.get("label") == "best":
                best.append(f"{_us(median)} ({_us(c.get('p20_us'))}–{_us(c.get('p80_us'))})" if median
                            else str(c.get("status")))
                continue
            name = str(c["label"]).removeprefix(COMPARATOR_PREFIX)
            if median and stored:
                ratios.setdefault(name, []).append(median / stored)
            if median and best_us:
                speedups.setdefault(name, []).append(median / best_us)
    ratio_cell = "; ".join(f"{name} {statistics.median(values):.3f}" for name, values in sorted(ratios.items()))
    speedup_cell = "; ".join(f"{name} {statistics.median(values):.2f}x ({len(values)})"
                             for name, values in sorted(speedups.items()))
    return " / ".join(best), ratio_cell or "–", speedup_cell or "–"


def _environment(fingerprints: Sequence[dict[str, object]]) -> list[str]:
    """One table per environment: fingerprints that differ only in the figures each process measures
    (:data:`tuner.keys.MEASURED_INFO`) share a table, those figures given as their range over the runs."""
    out = ["## Environment", ""]
    groups: list[tuple[dict[str, object], list[dict[str, object]]]] = []
    for fp in fingerprints:
        info = fp.get("info")
        fixed = fp
        if isinstance(info, dict):
            fixed = {**fp, "info": {k: v for k, v in info.items() if k not in MEASURED_INFO}}
        members = next((m for key, m in groups if key == fixed), None)
        if members is None:
            groups.append((fixed, [fp]))
        elif fp not in members:  # one run listed twice (a comparison of reports of one store): counted once
            members.append(fp)
    for fixed, members in groups:
        out += ["| field | value |", "|---|---|"]
        out += [f"| {k} | {fixed.get(k, '')} |" for k in ("kind", "device_name", "driver", "runtime")]
        libraries = fixed.get("libraries")
        out += [f"| {k} | {v} |" for k, v in sorted(libraries.items())] if isinstance(libraries, dict) else []
        measured: dict[str, list[object]] = {}
        for fp in members:
            info = fp.get("info")
            for k, v in info.items() if isinstance(info, dict) else ():
                if k in MEASURED_INFO:
                    measured.setdefault(k, []).append(v)
        info = fixed.get("info")
        cells = {k: str(v) for k, v in info.items()} if isinstance(info, dict) else {}
        cells.update({k: _measured_cell(values) for k, values in measured.items()})
        out += [f"| {k} | {v} |" for k, v in sorted(cells.items())]
        out.append("")
    return out


def _measured_cell(values: Sequence[object]) -> str:
    """A measured figure over the runs of one environment: the value, or its range and the number of runs."""
    distinct = sorted(set(values), key=str)
    if len(distinct) == 1:
        return str(distinct[0])
    numbers = [v for v in values if isinstance(v, int | float)]
    if len(numbers) == len(values):
        return f"{min(numbers):.4g}–{max(numbers):.4g} ({len(values)} runs)"
    return " / ".join(map(str, distinct))


def _gm_ratio(pairs: Sequence[tuple[float | None, float | None]]) -> str:
    """The geometric mean of other / best, to three decimals: targets are set on it (≥ 1.3 read as 1.30 from
    1.296 would hide a miss)."""
    ratios = [o / b for o, b in pairs if o and b]
    g = geomean(ratios)
    return "–" if g is None else f"**{g:.3f}x**{_mark(g)}"


def _mark(ratio: float) -> str:
    """🟢 faster, 🔴 slower, nothing for a tie (the best is the default config itself: the same figure)."""
    return "" if ratio == 1 else f" {GREEN if ratio > 1 else RED}"
