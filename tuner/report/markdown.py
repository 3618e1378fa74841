"""Markdown reports from the store: per workload, the best config against the incumbent and comparators.

Every figure in a row comes from one final round (measured interleaved in the same process run), so the
ratios are same-run ratios. Ratios are ``other / best``: above 1 means the tuned config is faster (🟢).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from tuner import registry
from tuner.driver.study import COMPARATOR_PREFIX, DEFAULT_LABEL
from tuner.frozen import Config, Shape
from tuner.results import Status
from tuner.store import MeasurementRecord, StudyRecord, TuningStore

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


@dataclass(frozen=True)
class Report:
    template: str
    version: str
    rows: tuple[ReportRow, ...]
    fingerprints: tuple[dict[str, object], ...] = field(default_factory=tuple)


def collect(store: TuningStore, template_name: str, *, device_kind: str | None = None) -> Report:
    """Read the latest study per (shape, device) of a template and its latest final round."""
    template = registry.get(template_name)
    studies = store.list_studies(template=template_name, device_kind=device_kind)
    latest: dict[tuple[str, str, str], StudyRecord] = {}
    for st in studies:
        k = (st.shape_key, st.device_kind, st.device_name)
        if k not in latest or st.id > latest[k].id:
            latest[k] = st
    rows = []
    fingerprints: dict[str, dict[str, object]] = {}
    for st in sorted(latest.values(), key=lambda s: (s.device_name, s.shape_key)):
        fingerprint = json.loads(st.fingerprint_json)
        fingerprints[st.fingerprint_hash] = fingerprint
        rows.append(_row(store, template, st, fingerprint))
    return Report(template.name, template.version, tuple(rows), tuple(fingerprints.values()))


def _row(store: TuningStore, template: object, st: StudyRecord, fingerprint: dict[str, object]) -> ReportRow:
    from tuner.template import KernelTemplate

    assert isinstance(template, KernelTemplate)
    shape = Shape.from_json(st.shape_json)
    final = store.latest_round(study_id=st.id)
    trials = store.list_measurements(study_id=st.id, role="trial")
    measured = [t for t in trials if t.status != Status.INVALID.value]
    failed = sum(1 for t in measured if t.status != Status.OK.value)
    search_s = _active_seconds([t.created_at for t in measured])
    best = _best_entry(final)
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
    info = fingerprint.get("info")
    bw = info.get("copy_bw_bytes_per_s") if isinstance(info, dict) else None
    roofline = None
    if best is not None and best.median_us and bw:
        roofline = 100.0 * template.bytes_moved(shape) / (best.median_us * 1e-6) / float(bw)
    return ReportRow(
        workload=template.workload_name(shape) or shape.key(),
        shape=shape,
        device=f"{st.device_kind}:{st.device_name}",
        timer=best.timer if best else None,
        best_config=Config.from_json(best.config_json) if best else None,
        best_us=best.median_us if best else None,
        best_spread=(best.p20_us, best.p80_us) if best and best.p20_us is not None and best.p80_us is not None
        else None,
        default_us=default.median_us if default else None,
        lines=tuple(_line(name, members) for name, members in sorted(lines.items())),
        roofline_pct=roofline,
        trials=len(measured),
        failed=failed,
        search_s=search_s,
        best_errors=best.errors if best else {},
        version=st.template_version,
        best_kernels=best.kernels if best else {},
    )


SESSION_GAP_S = 300.0  # trials further apart than this belong to separate runs of the search


def _active_seconds(stamps: Sequence[datetime]) -> float | None:
    """Wall time the search ran: the sum of the gaps between consecutive trials, leaving out gaps longer
    than SESSION_GAP_S (the search was resumed later, e.g. in another session)."""
    if len(stamps) < 2:
        return None
    ordered = sorted(stamps)
    gaps = ((b - a).total_seconds() for a, b in itertools.pairwise(ordered))
    return sum(g for g in gaps if g <= SESSION_GAP_S)


def _best_entry(final: Sequence[MeasurementRecord]) -> MeasurementRecord | None:
    ok = [m for m in final if not m.candidate.startswith(COMPARATOR_PREFIX) and m.status == Status.OK.value]
    return min(ok, key=lambda m: m.median_us or math.inf, default=None)


def _line(name: str, members: Sequence[MeasurementRecord]) -> Line:
    ok = [m for m in members if m.status == Status.OK.value and m.median_us is not None]
    if not ok:
        reasons = "; ".join(sorted({f"{m.status}: {(m.reason or '').splitlines()[0][:80]}" for m in members}))
        return Line(name, None, note=reasons)
    best = min(ok, key=lambda m: m.median_us or math.inf)
    return Line(name, best.median_us, best.candidate[len(COMPARATOR_PREFIX):], errors=best.errors,
                kernels=best.kernels)


def _ratio(other: float | None, best: float | None) -> str:
    if not other or not best:
        return "–"
    r = other / best
    return f"{r:.2f}x {GREEN if r > 1 else RED}"


def _us(value: float | None) -> str:
    return "–" if value is None else (f"{value:.2f}" if value < 100 else f"{value:.1f}")


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
        header += ["% roofline", "trials (failed)", "search s"]
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        for r in rows:
            spread = f" ({_us(r.best_spread[0])}–{_us(r.best_spread[1])})" if r.best_spread else ""
            cells = [
                r.workload if len(versions) == 1 else f"{r.workload} (v{r.version})",
                _config_cell(r.best_config),
                _us(r.best_us) + spread,
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
                f"{r.roofline_pct:.0f}%" if r.roofline_pct is not None else "–",
                f"{r.trials} ({r.failed})",
                f"{r.search_s:.0f}" if r.search_s is not None else "–",
            ]
            out.append("| " + " | ".join(cells) + " |")
        gm = ["**geometric mean**", "", "", "", _gm_ratio([(r.default_us, r.best_us) for r in rows])]
        for n in line_names:
            pairs = [(next((ln.median_us for ln in r.lines if ln.name == n), None), r.best_us) for r in rows]
            gm += ["", _gm_ratio(pairs)]
        gm += ["", "", ""]
        out.append("| " + " | ".join(gm) + " |")
        out.append("")
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
        header += ["strongest line / best", *[f"{n} best µs" for n in names], "% roofline",
                   "trials (failed), search s"]
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        ratios: dict[str, list[tuple[float | None, float | None]]] = {}
        for k in keys:
            name, row = winners[k]
            by_line = {ln.name: ln for ln in row.lines}
            strongest = min((ln.median_us for ln in row.lines if ln.median_us), default=None)
            cells = [k[1], name, _config_cell(row.best_config), _us_spread(row), _ratio(row.default_us, row.best_us)]
            ratios.setdefault("incumbent", []).append((row.default_us, row.best_us))
            for n in line_names:
                ln = by_line.get(n)
                t = ln.median_us if ln else None
                member = f" ({ln.member})" if ln and ln.member and ln.member != n else ""
                cells += [_us(t) + (member if t else ""), _ratio(t, row.best_us)]
                ratios.setdefault(n, []).append((t, row.best_us))
            cells.append(_ratio(strongest, row.best_us))
            ratios.setdefault("strongest", []).append((strongest, row.best_us))
            cells += [_us(by_key[k][n].best_us) if n in by_key[k] else "–" for n in names]
            cells.append(f"{row.roofline_pct:.0f}%" if row.roofline_pct is not None else "–")
            cells.append("; ".join(
                f"{n}: {r.trials} ({r.failed}), {r.search_s:.0f} s" if r.search_s is not None else f"{n}: {r.trials}"
                for n, r in sorted(by_key[k].items())
            ))
            out.append("| " + " | ".join(cells) + " |")
        gm = ["**geometric mean**", "", "", "", _gm_ratio(ratios["incumbent"])]
        for n in line_names:
            gm += ["", _gm_ratio(ratios[n])]
        gm += [_gm_ratio(ratios["strongest"]), *[""] * len(names), "", ""]
        out += ["| " + " | ".join(gm) + " |", ""]
    out += _environment([fp for r in reports for fp in r.fingerprints])
    return "\n".join(out) + "\n"


def _fastest(rows: dict[str, ReportRow]) -> tuple[str, ReportRow]:
    return min(rows.items(), key=lambda item: item[1].best_us if item[1].best_us is not None else math.inf)


def _config_cell(config: Config | None) -> str:
    return "`" + json.dumps(config.to_dict(), separators=(",", ":")) + "`" if config else "none"


def _us_spread(row: ReportRow) -> str:
    spread = f" ({_us(row.best_spread[0])}–{_us(row.best_spread[1])})" if row.best_spread else ""
    return _us(row.best_us) + spread


def _environment(fingerprints: Sequence[dict[str, object]]) -> list[str]:
    out = ["## Environment", ""]
    seen: list[dict[str, object]] = []
    for fp in fingerprints:
        if fp in seen:
            continue
        seen.append(fp)
        out += ["| field | value |", "|---|---|"]
        out += [f"| {k} | {fp.get(k, '')} |" for k in ("kind", "device_name", "driver", "runtime")]
        for part in ("libraries", "info"):
            values = fp.get(part)
            out += [f"| {k} | {v} |" for k, v in sorted(values.items())] if isinstance(values, dict) else []
        out.append("")
    return out


def _gm_ratio(pairs: Sequence[tuple[float | None, float | None]]) -> str:
    """The geometric mean of other / best, to three decimals: targets are set on it (≥ 1.3 read as 1.30 from
    1.296 would hide a miss)."""
    ratios = [o / b for o, b in pairs if o and b]
    g = geomean(ratios)
    return "–" if g is None else f"**{g:.3f}x** {GREEN if g > 1 else RED}"
