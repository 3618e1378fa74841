"""Plotly figures of the pages, as plain dicts (``{"data": [...], "layout": {...}}``) that the browser hands to
``Plotly.newPlot``: the server needs no plotting library, only the data. Times are µs on log axes.

Every function is pure: records in, a JSON-serialisable dict out.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tuner import db
from tuner.results import reason_line

STATUS_COLORS = {
    "OK": "#2e7d32",
    "INVALID": "#9e9e9e",
    "COMPILE_ERROR": "#ef6c00",
    "RUNTIME_ERROR": "#c62828",
    "WRONG_RESULT": "#8e24aa",
    "TIMEOUT": "#1565c0",
}
STATUS_ORDER = tuple(STATUS_COLORS)
BEST_COLOR, DEFAULT_COLOR, COMPARATOR_COLOR = "#2e7d32", "#ef6c00", "#546e7a"
Figure = dict[str, Any]
_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}


def _layout(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "margin": {"l": 60, "r": 20, "t": 30, "b": 45}, "font": _FONT, "hovermode": "closest",
        "plot_bgcolor": "#ffffff", "paper_bgcolor": "#ffffff",
        "legend": {"orientation": "h", "y": 1.12, "x": 0},
    }
    base.update(extra)
    return base


def log_ticks(values: Sequence[float | None]) -> dict[str, Any]:
    """Tick values 1-2-5 per decade covering ``values`` (plotly's own log ticks abbreviate 20 as "2")."""
    finite_values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not finite_values:
        return {}
    lo, hi = min(finite_values) / 1.15, max(finite_values) * 1.15
    ticks = [m * 10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1) for m in (1, 2, 5)]
    inside = [t for t in ticks if lo <= t <= hi]
    if len(inside) < 3:  # a narrow range: the coarsest 1-2-5 step that puts at least three ticks inside it
        top = math.floor(math.log10(hi - lo or hi))
        for step in (m * 10.0**e for e in range(top, top - 3, -1) for m in (5, 2, 1)):
            inside = [round(k * step, 12) for k in range(math.ceil(lo / step), math.floor(hi / step) + 1) if k > 0]
            if len(inside) >= 3:
                break
    return {"tickvals": inside, "ticktext": [f"{t:g}" for t in inside]}


def param_value(value: object) -> str:
    """A config value as the pages write it, server-side and in their live updates alike (ui.js ``String(v)``):
    JSON's ``true``/``false``/``null``, not Python's ``True``/``False``/``None``."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return str(value)


def _config_text(config_json: str) -> str:
    return ", ".join(f"{k}={param_value(v)}" for k, v in json.loads(config_json).items())


def _plain(text: str) -> str:
    """Stored text for Plotly's hover labels, which read a subset of HTML (links, styles): shown as written."""
    return html.escape(text, quote=False)


def _hover(m: db.MeasurementRecord) -> str:
    head = f"trial {m.trial_number}" if m.trial_number is not None else f"measurement {m.id}"
    lines = [f"<b>{head}</b> · {m.status.value}", _plain(_config_text(m.config_json))]
    if m.median_us is not None:
        spread = f" (p20–p80 {m.p20_us:.2f}–{m.p80_us:.2f})" if m.p20_us is not None and m.p80_us is not None else ""
        lines.append(f"{m.median_us:.2f} µs{spread}")
    if m.reason:
        lines.append(_plain(reason_line(m.reason)))
    return "<br>".join(lines)


def _order(m: db.MeasurementRecord) -> int:
    return m.trial_number if m.trial_number is not None else m.id


def trials_figure(trials: Sequence[db.MeasurementRecord]) -> Figure:
    """Every sweep trial in order: OK trials' medians (log axis) with the best-so-far line above, and every
    other trial on a strip below, one row per status; one trace per status, coloured by status."""
    ordered = sorted(trials, key=_order)
    data: list[dict[str, Any]] = []
    for status in STATUS_ORDER:
        members = [m for m in ordered if m.status.value == status]
        if not members:
            continue
        ok = status == "OK"
        data.append({
            "type": "scatter", "mode": "markers", "name": f"{status} ({len(members)})",
            "x": [_order(m) for m in members],
            "y": [m.median_us for m in members] if ok else [status] * len(members),
            "yaxis": "y" if ok else "y2",
            "text": [_hover(m) for m in members], "hoverinfo": "text",
            "marker": {"color": STATUS_COLORS[status], "size": 7 if ok else 8,
                       "symbol": "circle" if ok else "x-thin-open", "line": {"width": 1.5}},
            "meta": {"role": "trials", "status": status},
        })
    best: list[tuple[int, float]] = []
    for m in ordered:
        if m.ok and m.median_us is not None and (not best or m.median_us < best[-1][1]):
            best.append((_order(m), m.median_us))
    if best:
        last_x = max(_order(m) for m in ordered)
        xs = [x for x, _ in best] + [last_x]
        ys = [y for _, y in best] + [best[-1][1]]
        data.append({"type": "scatter", "mode": "lines", "name": "best so far", "x": xs, "y": ys,
                     "line": {"shape": "hv", "color": "#111111", "width": 1.5}, "hoverinfo": "y",
                     "meta": {"role": "best-so-far"}})
    failed = sorted({m.status.value for m in ordered if not m.ok}, key=STATUS_ORDER.index)
    strip = 0.06 * len(failed) + (0.06 if failed else 0.0)
    return {"data": data, "layout": _layout(
        xaxis={"title": {"text": "trial"}, "zeroline": False, "anchor": "y2" if failed else "y",
               "tickformat": "d", **({"dtick": 1} if len(ordered) <= 10 else {})},  # whole trials, no 0.5
        yaxis={"title": {"text": "median µs (log)"}, "type": "log", "domain": [min(strip + 0.06, 0.5), 1],
               **log_ticks([m.median_us for m in ordered if m.ok])},
        yaxis2={"domain": [0, max(strip, 0.0)], "type": "category", "categoryorder": "array",
                "categoryarray": failed, "visible": bool(failed), "tickfont": {"size": 10},
                "automargin": True},  # a status's name in full (WRONG_RESULT was cut at the left edge)
        height=420,
    )}


def _numeric(values: Sequence[object]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def parameter_figures(trials: Sequence[db.MeasurementRecord], names: Sequence[str]) -> list[tuple[str, Figure]]:
    """One small plot per parameter: the median of every OK trial against the parameter's value (a numeric
    axis for numbers, categories otherwise)."""
    ok = [(json.loads(m.config_json), m) for m in trials if m.ok and m.median_us is not None]
    figures = []
    for name in names:
        points = [(config[name], m) for config, m in ok if name in config]
        values = [v for v, _ in points]
        numeric = _numeric(values)
        categories = sorted({str(v) for v in values}, key=lambda s: (len(s), s)) if not numeric else []
        figures.append((name, {"data": [{
            "type": "scatter", "mode": "markers", "name": name,
            "x": values if numeric else [str(v) for v in values], "y": [m.median_us for _, m in points],
            "text": [_hover(m) for _, m in points], "hoverinfo": "text",
            "marker": {"color": STATUS_COLORS["OK"], "size": 6, "opacity": 0.7},
        }], "layout": _layout(
            margin={"l": 50, "r": 10, "t": 28, "b": 40}, height=230, showlegend=False,
            title={"text": name, "font": {"size": 13}},
            xaxis={"type": "log" if numeric and (_wide(values) or _doubling(values))
                   else ("linear" if numeric else "category"),
                   **({"categoryorder": "array", "categoryarray": categories} if categories else {}),
                   **_value_ticks(values if numeric else [])},
            yaxis={"type": "log", "title": {"text": "µs", "standoff": 6}, "automargin": True,
                   **log_ticks([m.median_us for _, m in points])},
        )}))
    return figures


def _value_ticks(values: Sequence[object]) -> dict[str, Any]:
    """Ticks at a numeric parameter's own values when it takes few (block sizes 2/4/8: no tick at 6 or 2.5)."""
    distinct = sorted({float(v) for v in values if isinstance(v, (int, float))})
    if not distinct or len(distinct) > 12:
        return {}
    return {"tickvals": distinct, "ticktext": [f"{v:g}" for v in distinct]}


def _doubling(values: Sequence[object]) -> bool:
    """Powers of two spanning at least a factor of 4 (block sizes 32/64/256): a log axis spaces them evenly."""
    nums = {v for v in values if isinstance(v, int) and not isinstance(v, bool)}
    return len(nums) == len(set(values)) and len(nums) >= 2 and all(v > 0 and v & (v - 1) == 0 for v in nums) \
        and max(nums) >= 4 * min(nums)


def _wide(values: Sequence[object]) -> bool:
    nums = [float(v) for v in values if isinstance(v, (int, float)) and float(v) > 0]
    return bool(nums) and len(nums) == len(values) and max(nums) / min(nums) >= 16


def final_labels(final: Sequence[db.MeasurementRecord]) -> dict[int, str]:
    """Short names of a final round's candidates: the comparator's name, ``default``, or ``config k`` (k-th
    fastest template config of the round)."""
    labels: dict[int, str] = {}
    configs = sorted((m for m in final if m.candidate == "config"),
                     key=lambda m: (m.median_us is None, m.median_us or 0.0, m.id))
    for k, m in enumerate(configs, 1):
        labels[m.id] = f"config {k}"
    for m in final:
        if m.candidate.startswith("comparator:"):
            labels[m.id] = m.candidate.removeprefix("comparator:")
        elif m.candidate == "default":
            labels[m.id] = "default config"
    return labels


def final_figure(final: Sequence[db.MeasurementRecord], best_id: int | None) -> Figure:
    """The final interleaved round: one horizontal bar per OK candidate (median, p20–p80 as the error bar)."""
    labels = final_labels(final)
    ok = sorted((m for m in final if m.ok and m.median_us is not None), key=lambda m: -(m.median_us or 0.0))
    colors = [BEST_COLOR if m.id == best_id else COMPARATOR_COLOR if m.candidate.startswith("comparator:")
              else DEFAULT_COLOR if m.candidate == "default" else "#81c784" for m in ok]
    longest = max((m.median_us or 0.0 for m in ok), default=0.0)
    return {"data": [{
        "type": "bar", "orientation": "h", "name": "median",
        "y": [labels[m.id] + (" ★" if m.id == best_id else "") for m in ok],
        "x": [m.median_us for m in ok], "marker": {"color": colors},
        "error_x": {"type": "data", "symmetric": False,
                    "array": [max(0.0, (m.p80_us or m.median_us or 0) - (m.median_us or 0)) for m in ok],
                    "arrayminus": [max(0.0, (m.median_us or 0) - (m.p20_us or m.median_us or 0)) for m in ok],
                    "color": "#333"},
        # each value at its bar's base, white on the bar (at the bar's end, "auto", it met the p20-p80 whisker);
        # past the end of a bar too short to hold it (its whisker is as short)
        "text": [f"{m.median_us:.2f} µs" for m in ok], "insidetextanchor": "start", "insidetextfont": {"color": "#fff"},
        "textposition": ["inside" if (m.median_us or 0.0) >= 0.12 * longest else "outside" for m in ok],
        "hovertext": [_hover(m) for m in ok], "hoverinfo": "text",
    }], "layout": _layout(xaxis={"title": {"text": "median µs (p20–p80); ★ published"}, "rangemode": "tozero"},
                          yaxis={"automargin": True}, height=max(180, 30 * len(ok) + 80), showlegend=False)}


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key putting the numbers in names in numeric order: ceiling-block512 before ceiling-block1024."""
    return tuple((0, int(part)) if part.isdecimal() else (1, part) for part in re.split(r"(\d+)", name) if part)


# a comparator family (the name before its first "-": mamba_ssm-fp32-bh8 is of mamba_ssm) of this many lines or
# more is drawn as its fastest line per shape, each line of it a legend entry left hidden until clicked
FAMILY_LINES = 3


def _key_parts(label: str) -> list[str] | None:
    parts = label.split(",")
    return parts if label and all("=" in part for part in parts) else None


def shared_parts(labels: Sequence[str]) -> list[str]:
    """The ``dim=value`` parts that every shape key among ``labels`` (two or more) has, in the first key's
    order; none where fewer than two labels are shape keys (workload names are not)."""
    keys = [k for k in map(_key_parts, labels) if k is not None]
    if len(keys) < 2:
        return []
    return [part for part in keys[0] if all(part in k for k in keys[1:])]


def shape_labels(labels: Sequence[str]) -> list[str]:
    """Axis labels of several shapes: a shape key (``B=1,H=48,…``) loses the parts every shape key among
    ``labels`` shares (:func:`shared_parts`; the figure names them); a workload name stays as it is. Plotly
    reads labels as a subset of HTML: the stored text is escaped (:func:`_plain`)."""
    shared = set(shared_parts(labels))
    out = []
    for label in labels:
        key = _key_parts(label)
        kept = [part for part in key if part not in shared] if key is not None else None
        out.append(_plain(", ".join(kept) if kept else label))
    return out


def lines_figure(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """Best against the default and each comparator line across shapes: a dot plot, one row per shape in
    ``rows``' order (:func:`shape_labels`; the hover names the whole shape), times on a log axis. A comparator family of
    :data:`FAMILY_LINES` lines or more (``mamba_ssm-fp32-bh1`` … ``mamba_ssm-wrapper``) is drawn as its
    fastest line per shape (the hover names which), its lines listed under the family's title in the legend,
    hidden until clicked: fourteen lines of one library would otherwise bury the best and the default.
    ``rows``: dicts with ``workload``, ``best_us``, ``default_us`` and ``lines`` (name → µs or None). The
    layout's ``meta.shared`` lists the shape parts left out of every label (:func:`shared_parts`)."""
    workloads = [str(r["workload"]) for r in rows]
    y, hover = shape_labels(workloads), [_plain(w) for w in workloads]
    names = sorted({n for r in rows for n in r["lines"]}, key=natural_key)
    families: dict[str, list[str]] = {}
    for name in names:
        families.setdefault(name.split("-", 1)[0], []).append(name)
    # drawn lines (a family's fastest, a line of its own) take distinct colours, up to eight of them; the
    # lines a legend click shows take theirs from a second sequence
    colours = itertools.cycle(["#546e7a", "#5c6bc0", "#8d6e63", "#26a69a", "#ab47bc", "#c0ca33", "#00838f", "#6d4c41"])
    hidden_colours = itertools.cycle(["#90a4ae", "#9fa8da", "#bcaaa4", "#80cbc4", "#ce93d8", "#e6ee9c"])

    def trace(name: str, ys: Sequence[float | None], color: str, symbol: str, size: int,
              **extra: Any) -> dict[str, Any]:
        return {"type": "scatter", "mode": "markers", "name": _plain(name), "y": y, "x": list(ys), "customdata": hover,
                "marker": {"color": color, "size": size, "symbol": symbol, "line": {"width": 1, "color": "#fff"}},
                "hovertemplate": f"{_plain(name)}: %{{x:.2f}} µs<extra>%{{customdata}}</extra>", **extra}

    data = [trace(name, [r[key] for r in rows], color, symbol, size)
            for name, key, color, symbol, size in (("best", "best_us", BEST_COLOR, "circle", 13),
                                                   ("default", "default_us", DEFAULT_COLOR, "diamond", 10))]
    shown: list[float | None] = [v for t in data for v in t["x"]]
    for family, members in families.items():
        values = {name: [r["lines"].get(name) for r in rows] for name in members}
        if len(members) < FAMILY_LINES:
            data += [trace(name, ys, next(colours), "square", 10)
                     for name, ys in values.items() if any(v is not None for v in ys)]
            shown += [v for ys in values.values() for v in ys]
            continue
        fastest = [min(((ys[j], name) for name, ys in values.items() if ys[j] is not None), default=None)
                   for j in range(len(rows))]
        group = {"legendgroup": family, "legendgrouptitle": {"text": _plain(family)}}
        head = trace(f"fastest of {len(members)} lines", [f[0] if f else None for f in fastest],
                     next(colours), "square", 11, **group)
        head["text"] = [_plain(f[1]) if f else "" for f in fastest]
        head["hovertemplate"] = "%{text}: %{x:.2f} µs<extra>%{customdata}</extra>"
        data.append(head)
        shown += head["x"]
        data += [trace(name.removeprefix(family + "-") or name, ys, next(hidden_colours), "square", 8,
                       visible="legendonly", **group)
                 for name, ys in values.items() if any(v is not None for v in ys)]
    data = [t for t in data if any(v is not None for v in t["x"])]
    return {"data": data, "layout": _layout(
        xaxis={"type": "log", "title": {"text": "median µs (log)"}, **log_ticks(shown)},
        yaxis={"automargin": True, "type": "category", "autorange": "reversed"},
        legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "groupclick": "toggleitem"},
        margin={"l": 20, "r": 20, "t": 20, "b": 45}, height=max(260, 26 * len(rows) + 110),
        meta={"shared": shared_parts(workloads)})}


def ecdf_figure(named: Sequence[tuple[str, Sequence[db.MeasurementRecord]]]) -> Figure:
    """The distribution of OK trial medians of several studies (fraction of trials at or below a time)."""
    palette = ["#1565c0", "#ef6c00", "#2e7d32", "#8e24aa"]
    data = []
    every: list[float] = []
    for i, (name, trials) in enumerate(named):
        times = sorted(m.median_us for m in trials if m.ok and m.median_us is not None)
        every.extend(t for t in times if t > 0)
        n = len(times)
        data.append({"type": "scatter", "mode": "lines", "name": name, "x": times,
                     "y": [(k + 1) / n for k in range(n)], "line": {"shape": "hv", "color": palette[i % 4]}})
    span = {"range": [math.log10(min(every) / 1.15), math.log10(max(every) * 1.15)]} if every else {}
    # the legend under the plot (above it, it covered the curves' last steps near 1) and the x range padded
    # by log_ticks (the slowest trial sat on the right edge)
    return {"data": data, "layout": _layout(
        xaxis={"type": "log", "title": {"text": "median µs (log)"}, **log_ticks(every), **span},
        yaxis={"title": {"text": "fraction of OK trials"}, "range": [0, 1.04], "automargin": True},
        legend={"orientation": "h", "x": 0, "y": -0.2, "yanchor": "top"},
        margin={"l": 60, "r": 20, "t": 20, "b": 90}, height=380)}


def finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) or math.isinf(value) else value
