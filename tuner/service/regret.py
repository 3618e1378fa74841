"""Nearest-shape regret: how much the lookup's fallback loses against a tune of the shape itself.

Leave-one-out over a store: for every shape with its own published best, the config the lookup would
serve if that shape had no entry (:func:`tuner.lookup.choose` over the other shapes' entries of the same
template version and device, with the same constraint check and default), timed from the shape's own
records, against the shape's own best. Nothing is measured here: a served config the shape's study never
measured is reported as unmeasured.

Timing basis, so that both figures come from the same kind of measurement:
  * ``final round``: the served config was re-measured in the final round that published the shape's best
    (interleaved with it): served median / best median − 1;
  * ``trials``: otherwise, when both configs were measured as trials: the median of the served config's
    trial medians / that of the best config − 1 (negative when a trial of the served config beat the
    trials of the published best: the published best is then not the fastest recorded config);
  * unmeasured: otherwise; :func:`measure_unmeasured` (``tuner regret --measure``) then measures the served
    config interleaved with the shape's own best on this device, when the shape's records are of this
    device name (``measured now``: served median / best median − 1 of that one run).
The default config of a version that is no longer registered is the one the study measured as its
``default`` candidate (the final round records it).

Pure functions over immutable values (:class:`RecordedShape` in, :class:`RegretReport` out); loading them
from a store is :func:`recorded_shapes`.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tuner.distance import DEFAULT_DISTANCE, ShapeDistance
from tuner.lookup import MIN_GAIN, NEAR_DISTANCE, ConfigChange, Domain, Entry, choose
from tuner.store import TuningStore
from tuner.store.entries import published_entries

if TYPE_CHECKING:
    from tuner.measure.measurer import Measurer

Valid = Callable[[Mapping[str, Any], Mapping[str, Any]], bool]


def config_key(config: Mapping[str, Any]) -> str:
    """Canonical JSON of a config (the text the store keeps in ``config_json``)."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class RecordedShape:
    """One shape with its own published best, and the times its study recorded (µs, by :func:`config_key`)."""

    entry: Entry
    final: Mapping[str, float] = field(default_factory=dict)  # the final round that published the best
    trials: Mapping[str, float] = field(default_factory=dict)  # median of each config's trial medians
    default: Mapping[str, Any] | None = None  # the config measured as the 'default' candidate, if any

    def time_of(self, config: Mapping[str, Any]) -> tuple[float | None, str | None]:
        """(served / best − 1, basis) for ``config`` on this shape, or (None, None) when unmeasured."""
        key, own = config_key(config), config_key(self.entry.config)
        if key == own:
            return 0.0, "own best"
        best_final = self.final.get(own, self.entry.median_us)
        if key in self.final and best_final:
            return self.final[key] / best_final - 1.0, "final round"
        if key in self.trials and self.trials.get(own):
            return self.trials[key] / self.trials[own] - 1.0, "trials"
        return None, None


@dataclass(frozen=True)
class RegretRow:
    """What the lookup would serve for one held-out shape, and what it would lose."""

    shape: Mapping[str, Any]
    match: str  # 'nearest' | 'default' | 'none' (no entry and no default)
    source_shape: Mapping[str, Any] | None
    distance: float | None
    config: Mapping[str, Any] | None
    best_us: float
    regret: float | None  # fraction: 0.05 = the served config is 5% slower than the shape's own best
    basis: str | None  # 'own best' | 'final round' | 'trials' | None (unmeasured)
    repaired: tuple[ConfigChange, ...] = ()  # the lookup's repair of the source entry's config, if any

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": dict(self.shape), "match": self.match,
            "source_shape": dict(self.source_shape) if self.source_shape is not None else None,
            "distance": self.distance, "config": dict(self.config) if self.config is not None else None,
            "best_us": self.best_us, "regret": self.regret, "basis": self.basis,
            "repaired": [{"param": c.param, "entry": c.entry, "served": c.served} for c in self.repaired],
        }


@dataclass(frozen=True)
class RegretReport:
    """Leave-one-out regret of one template version on one device, under one distance."""

    template: str
    template_version: str
    device_kind: str
    device_name: str
    distance: str
    rows: tuple[RegretRow, ...]
    notes: tuple[str, ...] = ()

    @property
    def measured(self) -> list[float]:
        return sorted(r.regret for r in self.rows if r.regret is not None)

    @property
    def unmeasured(self) -> int:
        return sum(1 for r in self.rows if r.regret is None)

    def median(self) -> float | None:
        return quantile(self.measured, 0.5)

    def p90(self) -> float | None:
        return quantile(self.measured, 0.9)

    def to_dict(self) -> dict[str, Any]:
        return {
            "template": self.template, "template_version": self.template_version,
            "device_kind": self.device_kind, "device_name": self.device_name, "distance": self.distance,
            "shapes": len(self.rows), "measured": len(self.measured), "unmeasured": self.unmeasured,
            "median": self.median(), "p90": self.p90(), "worst": self.measured[-1] if self.measured else None,
            "rows": [r.to_dict() for r in self.rows], "notes": list(self.notes),
        }


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (linear interpolation between order statistics); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def leave_one_out(
    shapes: Sequence[RecordedShape],
    *,
    default: Mapping[str, Any] | None = None,
    valid: Valid | None = None,
    distance: ShapeDistance = DEFAULT_DISTANCE,
    domains: Sequence[Domain] | None = None,
    min_gain: float = MIN_GAIN,
    near_distance: float = NEAR_DISTANCE,
) -> list[RegretRow]:
    """One row per shape: the lookup's answer without that shape's entries, timed from its records. A shape
    with several bests (published under different fingerprints) is held out once, with its latest best.

    ``default``: the template's default config (None: each shape's recorded default candidate);
    ``valid(config, shape)``: the template's constraint check (None: not checked); ``domains``: the search
    space's, for the lookup's repairs of invalid configs (None: none). Never raises.
    """
    rows: list[RegretRow] = []
    latest = latest_bests(shapes, key=lambda e: config_key(e.shape))
    for held in shapes:
        key = config_key(held.entry.shape)
        if latest[key] is not held:
            continue  # superseded by a later best of the same shape (e.g. under newer software)
        others = [s.entry for s in shapes if config_key(s.entry.shape) != key]
        fallback = default if default is not None else held.default
        answer = choose(held.entry.shape, others, default=fallback, valid=valid,
                        device_name=held.entry.device_name, distance=distance, domains=domains, min_gain=min_gain,
                        near_distance=near_distance)
        if answer is None:
            rows.append(RegretRow(held.entry.shape, "none", None, None, None, _best_us(held), None, None))
            continue
        regret, basis = held.time_of(answer.config)
        rows.append(RegretRow(
            held.entry.shape, answer.match, answer.entry.shape if answer.entry else None, answer.distance,
            answer.config, _best_us(held), regret, basis, answer.repaired,
        ))
    return rows


def _own_key(entry: Entry) -> tuple[str, str, str]:
    return entry.template_version, entry.device_name, config_key(entry.shape)


def latest_bests(
    shapes: Sequence[RecordedShape], key: Callable[[Entry], Hashable] = _own_key
) -> dict[Hashable, RecordedShape]:
    """Per ``key`` of its entry (default: template version, device name and shape): the most recently
    published best — the one the lookup serves, held out by :func:`leave_one_out` (per shape, within one
    group) and measured against by :func:`measure_unmeasured`."""
    latest: dict[Hashable, RecordedShape] = {}
    for s in sorted(shapes, key=lambda s: s.entry.published_at or ""):
        latest[key(s.entry)] = s
    return latest


def _best_us(shape: RecordedShape) -> float:
    return float(shape.entry.median_us) if shape.entry.median_us is not None else math.nan


Group = tuple[str, str, str, str]  # template, template version, device kind, device name


def group_entries(shapes: Sequence[RecordedShape]) -> dict[Group, list[RecordedShape]]:
    """Shapes by (template, template version, device kind, device name): the lookup compares entries of one
    version (a carried version's entries are served only where the current version has none; regret judges
    each version's entries among themselves)."""
    groups: dict[Group, list[RecordedShape]] = defaultdict(list)
    for s in shapes:
        e = s.entry
        groups[(e.template, e.template_version, e.device_kind, e.device_name)].append(s)
    return dict(groups)


def median_of(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def recorded_shapes(store: TuningStore, *, template: str, device_kind: str | None = None) -> list[RecordedShape]:
    """Every published best of ``template`` (all versions and devices) with its study's recorded times.

    Comparators are left out. Raises StoreError."""
    shapes: list[RecordedShape] = []
    for best, entry in published_entries(store, template=template, device_kind=device_kind):
        rows = [m for m in store.list_measurements(study_id=best.study_id, status="OK")
                if not m.candidate.startswith("comparator:") and m.median_us is not None]
        own = next((m for m in rows if m.id == best.measurement_id), None)
        round_id = own.round_id if own is not None and own.role == "final" else None
        final = {config_key(m.config): float(m.median_us) for m in rows  # type: ignore[arg-type]
                 if round_id is not None and m.role == "final" and m.round_id == round_id}
        trial_times: dict[str, list[float]] = defaultdict(list)
        for m in rows:
            if m.role == "trial":
                trial_times[config_key(m.config)].append(float(m.median_us))  # type: ignore[arg-type]
        default = next((m.config for m in rows if m.candidate == "default" and m.round_id == round_id
                        and round_id is not None), None)
        shapes.append(RecordedShape(
            entry=entry, final=final,
            trials={k: median_of(v) for k, v in trial_times.items()}, default=default,
        ))
    return shapes


# (default config, constraint check, parameter domains) of a template version, or None when that version is
# not registered.
SpaceOf = Callable[[str], "tuple[Mapping[str, Any], Valid, Sequence[Domain]] | None"]


def regret_reports(
    shapes: Sequence[RecordedShape], *, space_of: SpaceOf, distance: ShapeDistance = DEFAULT_DISTANCE,
    min_gain: float = MIN_GAIN, near_distance: float = NEAR_DISTANCE,
) -> list[RegretReport]:
    """One report per (template, version, device kind, device name) of ``shapes``, in that order.

    ``space_of(version)`` gives the registered version's default, constraint check and parameter domains (the
    lookup repairs invalid configs within them); for other versions each shape's recorded default is used
    and constraints are not checked (said in the report's notes)."""
    reports = []
    for (template, version, kind, name), group in sorted(group_entries(shapes).items()):
        space = space_of(version)
        notes: tuple[str, ...] = ()
        if space is None:
            notes = (f"version {version} is not the registered one: constraints not checked, "
                     "default = the default candidate each study measured",)
        rows = leave_one_out(group, default=space[0] if space else None, valid=space[1] if space else None,
                             distance=distance, domains=space[2] if space else None, min_gain=min_gain,
                             near_distance=near_distance)
        reports.append(RegretReport(template, version, kind, name, distance.name, tuple(rows), notes))
    return reports


def registered_space(template: str) -> SpaceOf:
    """``space_of`` from the registry: the registered template's version only (imports the template)."""
    from tuner import registry

    t = registry.get(template)
    space = t.space()
    checked = (space.default.to_dict(), space.constraint_check, space.domains)
    return lambda version: checked if version == t.version else None


MEASURED_NOW = "measured now"


def measure_unmeasured(
    reports: Sequence[RegretReport], shapes: Sequence[RecordedShape], measurer: Measurer, *, version: str
) -> list[RegretReport]:
    """``reports`` with their unmeasured rows measured: the served config and the shape's own best, interleaved
    in one run of ``measurer`` (its device name must be the one the shape's records come from, the template
    version the registered ``version``; other rows stay unmeasured, said in the notes). Raises DeviceError /
    MeasureSetupError from the measurer; a candidate that fails leaves its row unmeasured, with a note, and a
    note per report says how many rows were measured and how many failed, by status."""
    from tuner import registry
    from tuner.frozen import Config, Shape
    from tuner.measure.protocol import Candidate

    here = measurer.fingerprint().device_name
    bests = latest_bests(shapes)
    out: list[RegretReport] = []
    for report in reports:
        todo = [i for i, r in enumerate(report.rows) if r.regret is None and r.config is not None]
        if not todo:
            out.append(report)
            continue
        if report.device_name != here or report.template_version != version:
            why = (f"recorded on {report.device_name}, this device is {here}" if report.device_name != here
                   else f"version {report.template_version} is not the registered one ({version})")
            out.append(replace(report, notes=(*report.notes, f"{len(todo)} unmeasured row(s) not measured: {why}")))
            continue
        rows, notes = list(report.rows), list(report.notes)
        ref = registry.ref_of(report.template)
        failures: Counter[str] = Counter()
        for i in todo:
            row = rows[i]
            own = bests[(report.template_version, report.device_name, config_key(row.shape))].entry
            assert row.config is not None
            pair = [Candidate(config=Config(dict(own.config))), Candidate(config=Config(dict(row.config)))]
            best, served = measurer.measure_interleaved(ref, Shape(dict(row.shape)), pair)
            if best.ok and served.ok and best.median_us and served.median_us:
                rows[i] = replace(row, regret=served.median_us / best.median_us - 1.0, basis=MEASURED_NOW)
            else:
                parts = [f"{who} {r.status.value}: {r.reason}" for who, r in
                         (("its own best", best), ("the served config", served)) if not (r.ok and r.median_us)]
                failures[(served if best.ok and best.median_us else best).status.value] += 1
                notes.append(f"{_shape_text(row.shape)}: not measured now ({'; '.join(parts)})")
        notes.append(_tried_note(len(todo), failures, here))
        out.append(replace(report, rows=tuple(rows), notes=tuple(notes)))
    return out


def _tried_note(tried: int, failures: Counter[str], here: str) -> str:
    """How many of the ``tried`` rows were measured now and how many failed (by status): a failed pair is not
    reported as measured."""
    failed = sum(failures.values())
    text = (f"{tried} served config(s) the records lacked tried on {here}, each interleaved with the shape's own "
            f"best: {tried - failed} measured OK")
    if failed:
        statuses = ", ".join(f"{status}: {n}" for status, n in sorted(failures.items()))
        text += f", {failed} failed ({statuses}) and {'stays' if failed == 1 else 'stay'} unmeasured"
    return text


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.1f}%"


def _shape_text(shape: Mapping[str, Any] | None) -> str:
    if shape is None:
        return "—"
    return ",".join(f"{k}={str(shape[k]).lower() if isinstance(shape[k], bool) else shape[k]}" for k in sorted(shape))


def summary_line(report: RegretReport) -> str:
    """``median +1.2%, p90 +4.8% over 9 timed of 11 shapes (2 unmeasured)``."""
    return (f"median {_pct(report.median())}, p90 {_pct(report.p90())} over {len(report.measured)} timed of "
            f"{len(report.rows)} shapes ({report.unmeasured} unmeasured)")


def render_markdown(reports: Sequence[RegretReport], *, level: int = 2) -> str:
    """A markdown section per report: the summary, then one row per held-out shape."""
    out: list[str] = []
    for r in reports:
        out += [f"{'#' * level} Nearest-shape regret: {r.template} v{r.template_version} on {r.device_name}", "",
                f"Distance `{r.distance}`; {summary_line(r)}. Leave-one-out: each shape's own entry removed, "
                "the config the lookup would serve, timed from that shape's records, against its own best.", ""]
        out += [f"_{note}_" for note in r.notes] + ([""] if r.notes else [])
        out += ["| shape | served | from shape | distance | best µs | regret | timed from |",
                "|---|---|---|---:|---:|---:|---|"]
        for row in r.rows:
            distance = "—" if row.distance is None else f"{row.distance:.3g}"
            served = row.match + (f" (repaired: {', '.join(map(str, row.repaired))})" if row.repaired else "")
            out.append(f"| {_shape_text(row.shape)} | {served} | {_shape_text(row.source_shape)} | {distance} | "
                       f"{row.best_us:.3f} | {_pct(row.regret)} | {row.basis or 'unmeasured'} |")
        out.append("")
    return "\n".join(out)
