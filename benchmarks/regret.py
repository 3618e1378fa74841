"""Nearest-shape regret of the lookup over the committed H200 stores, for each candidate distance; writes
benchmarks/regret.md, from which the lookup's distance (tuner.distance.DEFAULT_DISTANCE) was chosen.

    python benchmarks/regret.py [--stores 'benchmarks/h200/*.db'] [-o benchmarks/regret.md]

Each store is copied to a temporary directory first (opening a store may migrate it: the committed files
are never written). Nothing is measured: the served configs are timed from the stores' records (see
tuner.service.regret); a served config a shape's study never measured is counted as unmeasured.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import math
import sys
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import db  # noqa: E402
from tuner import registry  # noqa: E402
from tuner.distance import CANDIDATES, DEFAULT_DISTANCE, ShapeDistance  # noqa: E402
from tuner.errors import TunerError  # noqa: E402
from tuner.lookup import MIN_GAIN, NEAR_DISTANCE, Domain, repair_config  # noqa: E402
from tuner.service.regret import (  # noqa: E402
    RecordedShape,
    RegretReport,
    SpaceOf,
    Valid,
    config_key,
    quantile,
    recorded_shapes,
    registered_space,
    regret_reports,
    render_markdown,
)

GOAL_MEDIAN, GOAL_P90 = 0.02, 0.05


Data = dict[tuple[str, str], tuple[list[RecordedShape], SpaceOf, str | None]]


def load(paths: Sequence[Path], workdir: Path) -> Data:
    """Per (store file, template): its recorded shapes, its ``space_of`` and its registered version. Each
    store is a world of its own: a shape recorded in two stores is left out of each one separately."""
    found: Data = {}
    for path in paths:
        copy = workdir / path.name
        db.copy_database(path, copy)
        with db.Store.open(db.sqlite_url(copy)) as store:
            for name in sorted({b.template for b in store.list_best()}):
                try:
                    space_of, version = registered_space(name), registry.get(name).version
                except (TunerError, ImportError) as exc:
                    print(f"{name}: not registered ({exc}); constraints not checked", file=sys.stderr)
                    space_of, version = (lambda v: None), None
                found[(path.name, name)] = (recorded_shapes(store, template=name), space_of, version)
    return found


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.1f}%"


def evaluate(data: Data, distance: ShapeDistance, min_gain: float = MIN_GAIN,
             near_distance: float = NEAR_DISTANCE) -> list[tuple[str, RegretReport, bool]]:
    """(store, report, is the registered version) per store and template version, under ``distance`` and
    the lookup's gain gate (``min_gain``, growing beyond ``near_distance``)."""
    out = []
    for (store, _), (shapes, space_of, version) in sorted(data.items()):
        for report in regret_reports(shapes, space_of=space_of, distance=distance, min_gain=min_gain,
                                     near_distance=near_distance):
            out.append((store, report, report.template_version == version))
    return out


def pooled(reports: Sequence[tuple[str, RegretReport, bool]], current: bool) -> tuple[int, list[float], int]:
    rows = [row for _, r, is_current in reports if is_current == current for row in r.rows]
    timed = sorted(row.regret for row in rows if row.regret is not None)
    return len(rows), timed, len(rows) - len(timed)


def render(data: Data, command: str,
           stores: Sequence[Path]) -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = ["# Nearest-shape regret of the lookup (H200 stores)", "",
           f"Generated {now} by `{command}` from {', '.join(f'`{p.relative_to(ROOT)}`' for p in stores)} "
           "(copied before opening). Nothing measured here: each shape's own entry is left out, the config the "
           "lookup would then serve is timed from that shape's records (its final round, else its trials), "
           "against the shape's own best; served configs the shape never measured are *unmeasured*. "
           "Regret = served / own best − 1. *Current*: the registered template versions, the ones `GET /v1/best` "
           "serves; older versions are in the stores too and shown apart.", "",
           "## Candidate distances", "",
           "| distance | what it costs | current: median | p90 | timed / shapes | above 5% | older versions: median "
           "| p90 | timed / shapes |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    results = {}
    for d in CANDIDATES:
        reports = evaluate(data, d)
        results[d.name] = reports
        cells = []
        for current in (True, False):
            n, timed, _ = pooled(reports, current)
            cells += [_pct(quantile(timed, 0.5)), _pct(quantile(timed, 0.9)), f"{len(timed)} / {n}"]
            if current:
                cells.append(str(sum(1 for v in timed if v > GOAL_P90)))
        chosen = " (chosen)" if d == DEFAULT_DISTANCE else ""
        out.append(f"| `{d.name}`{chosen} | {d.describe()} | {' | '.join(cells)} |")
    out += ["", "## Per template version", "",
            "| store | template | version | distance | median | p90 | worst | timed / shapes |",
            "|---|---|---|---|---:|---:|---:|---:|"]
    for d in CANDIDATES:
        for store, r, current in results[d.name]:
            worst = r.measured[-1] if r.measured else None
            version = f"{r.template_version}{' (current)' if current else ''}"
            figures = f"{_pct(r.median())} | {_pct(r.p90())} | {_pct(worst)} | {len(r.measured)} / {len(r.rows)}"
            out.append(f"| {store} | {r.template} | {version} | `{d.name}` | {figures} |")
    out += sensitivity(data)
    out += gain_gate(data)
    n, timed, unmeasured = pooled(results[DEFAULT_DISTANCE.name], True)
    median, p90 = quantile(timed, 0.5), quantile(timed, 0.9)
    out += ["", "## Against the goal (median ≤ 2%, p90 ≤ 5%), chosen distance, current versions", "",
            f"`{DEFAULT_DISTANCE.name}`: median {_pct(median)}, p90 {_pct(p90)} over {len(timed)} timed shapes "
            f"({unmeasured} of {n} unmeasured). " + _verdict(median, p90), ""]
    out += oracle(data)
    out += ["## Every held-out shape under the chosen distance", ""]
    for store in sorted({store for store, _, _ in results[DEFAULT_DISTANCE.name]}):
        out += [f"### {store}", ""]
        out.append(render_markdown([r for s, r, _ in results[DEFAULT_DISTANCE.name] if s == store], level=4))
    return "\n".join(out)


def sensitivity(data: Data) -> list[str]:
    """The chosen distance with its max_distance and its weight floor varied (current versions pooled)."""
    out = ["", "## The chosen distance's two settings, varied (current versions)", "",
           "`max_distance`: entries farther are not served (the default is); `weight_floor`: the least weight "
           "a learnt dim gets.", "",
           "| max_distance | weight_floor | median | p90 | timed / shapes | above 5% |",
           "|---:|---:|---:|---:|---:|---:|"]
    variants = [(m, DEFAULT_DISTANCE.weight_floor) for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, math.inf)]
    variants += [(DEFAULT_DISTANCE.max_distance, f) for f in (0.0, 0.25, 0.5, 1.0)]
    for max_distance, floor in variants:
        d = dataclasses.replace(DEFAULT_DISTANCE, max_distance=max_distance, weight_floor=floor)
        n, timed, _ = pooled(evaluate(data, d), True)
        chosen = " (chosen)" if d == DEFAULT_DISTANCE else ""
        out.append(f"| {max_distance:g}{chosen} | {floor:g} | {_pct(quantile(timed, 0.5))} | "
                   f"{_pct(quantile(timed, 0.9))} | {len(timed)} / {n} | {sum(1 for v in timed if v > GOAL_P90)} |")
    return out


def gain_gate(data: Data) -> list[str]:
    """The chosen distance with the lookup's gain gate varied (current versions pooled): another shape's
    entry at distance d is served only if its config beat the default on its own shape by ``min_gain`` ×
    max(1, d / ``near_distance``); and the lookup as it was before the twenty-sixth session (2026-12-04: a cap
    at 3, a flat gate). The sum of the timed regrets tells apart settings whose quantiles agree."""
    out = ["", "## The gain gate, varied (current versions, the chosen distance)", "",
           "`min_gain`: an entry of another shape is served only if its config ran at least this much faster "
           "than the default in the final round that published it (else the next entry, or the default); 0 "
           "turns this off. `near_distance`: beyond it the gain asked grows in proportion to the distance "
           "(`min_gain` × distance / `near_distance`), an entry without a default figure is not served, and "
           "entries rank after every nearer one; inf: none of the three. Σ: the sum of the timed regrets.", "",
           "| min_gain | near_distance | median | p90 | worst | Σ | timed / shapes | above 5% |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    variants = [(DEFAULT_DISTANCE, g, NEAR_DISTANCE, "") for g in (0.0, 0.02, 0.03, 0.05, 0.1, 0.2)]
    variants += [(DEFAULT_DISTANCE, MIN_GAIN, nd, "") for nd in (1.0, 1.5, 2.0, 2.5, 4.0, math.inf)]
    capped = dataclasses.replace(DEFAULT_DISTANCE, max_distance=3.0)
    variants.append((capped, MIN_GAIN, math.inf, " (the lookup before 2026-12-04's change: nothing served beyond 3)"))
    for distance, gain, near_distance, label in variants:
        n, timed, _ = pooled(evaluate(data, distance, gain, near_distance), True)
        chosen = (" (chosen)" if (distance, gain, near_distance) == (DEFAULT_DISTANCE, MIN_GAIN, NEAR_DISTANCE)
                  else label)
        out.append(f"| {gain:g} | {near_distance:g}{chosen} | {_pct(quantile(timed, 0.5))} | "
                   f"{_pct(quantile(timed, 0.9))} | {_pct(timed[-1] if timed else None)} | {_pct(sum(timed))} | "
                   f"{len(timed)} / {n} | {sum(1 for v in timed if v > GOAL_P90)} |")
    return out


def oracle(data: Data) -> list[str]:
    """What no distance can beat: per held-out shape, the best timed choice among the other shapes' configs
    (valid for it, or repaired as the lookup repairs them) and the default (current versions); the shapes
    where even that loses more than 5%. A shape none of whose choices was timed (never measured on it, or
    every measurement of them failed) is skipped with a line saying so."""
    best: list[float] = []
    lines: list[str] = []
    skipped: list[str] = []
    for (store, _), (shapes, space_of, version) in sorted(data.items()):
        current = [s for s in shapes if s.entry.template_version == version]
        space = space_of(version) if version is not None else None
        if space is None:
            continue
        latest = {config_key(s.entry.shape): s for s in sorted(current, key=lambda s: s.entry.published_at or "")}
        for held in latest.values():  # a shape's latest best, as tuner.service.regret.leave_one_out holds out
            here = held.entry.shape
            others = [s for s in current if config_key(s.entry.shape) != config_key(here)]
            timed, invalid = _timed_choices(held, others, space)
            choices = {k: v for k, v in timed.items() if v is not None}
            if not choices:
                skipped.append(f"- {store}, {held.entry.template} {_shape(here)}: skipped, no choice timed on it "
                               f"({len(timed)} choices: {', '.join(timed)}; none has an OK measurement in its "
                               "records)")
                continue
            value, source = min((v, k) for k, v in choices.items())
            best.append(value)
            if value > GOAL_P90:
                lines.append(f"| {store} | {held.entry.template} | {_shape(here)} | {_pct(value)} ({source}) | "
                             f"{invalid} of {len(others)} | {len(timed) - len(choices)} |")
    best.sort()
    return ["## What no distance can do: the best of every choice, per shape (current versions)", "",
            "For each held-out shape, the best timed choice among every other shape's config that is valid for it "
            "or repaired (as the lookup repairs an invalid one, each on its own budget) and the default: median "
            f"{_pct(quantile(best, 0.5))}, p90 {_pct(quantile(best, 0.9))} over {len(best)} shapes"
            f"{f' ({len(skipped)} skipped: no choice timed)' if skipped else ''}, "
            f"{sum(1 for v in best if v > GOAL_P90)} above 5%. A distance only picks among these, so on no shape "
            "does a distance do better; this p90 is over every shape "
            f"{'with a timed choice' if skipped else '(each has a timed choice)'}, the lookup's figures "
            "above only over the shapes whose served config was timed, hence can be lower. Shapes where even the "
            "best choice loses more than 5%:", "",
            "| store | template | shape | best choice | neighbours' configs invalid for it | choices (valid, repaired "
            "or default) never measured on it |", "|---|---|---|---:|---:|---:|", *lines, "",
            *(["Shapes left out (none of their choices timed):", "", *skipped, ""] if skipped else [])]


def _timed_choices(held: RecordedShape, others: Sequence[RecordedShape],
                   space: tuple[Mapping[str, Any], Valid, Sequence[Domain]]) -> tuple[dict[str, float | None], int]:
    """Every choice for ``held`` (the other shapes' configs, valid or repaired, and the default) with its
    time from ``held``'s records (None: never timed), and how many of the others' configs are invalid for it."""
    default, valid, domains = space
    here = held.entry.shape
    choices_of = {f"{_shape(s.entry.shape)}'s": s.entry.config for s in others if valid(s.entry.config, here)}
    invalid = [s for s in others if not valid(s.entry.config, here)]
    for s in invalid:
        repaired = repair_config(s.entry.config, here, domains, valid)
        if repaired is not None:
            choices_of[f"{_shape(s.entry.shape)}'s, repaired"] = repaired[0]
    choices_of["the default"] = default
    return {k: held.time_of(c)[0] for k, c in choices_of.items()}, len(invalid)


def _shape(shape: Mapping[str, object]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(shape.items()))


def _verdict(median: float | None, p90: float | None) -> str:
    if median is None or p90 is None:
        return "No timed shape: the goal cannot be judged."
    parts = []
    for what, value, goal in (("median", median, GOAL_MEDIAN), ("p90", p90, GOAL_P90)):
        if value <= goal:
            parts.append(f"the {what} meets its goal")
        else:
            parts.append(f"the {what} misses its goal by {(value - goal) * 100:.1f} points")
    return "; ".join(parts).capitalize() + "."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default="benchmarks/h200/*.db", help="glob of SQLite stores, from the repo root")
    parser.add_argument("-o", "--output", type=Path, default=ROOT / "benchmarks" / "regret.md")
    args = parser.parse_args(argv)
    stores = sorted(Path(p).resolve() for p in glob.glob(str(ROOT / args.stores)))
    if not stores:
        parser.error(f"no store matches {args.stores}")
    with tempfile.TemporaryDirectory(prefix="regret-") as tmp:
        data = load(stores, Path(tmp))
    command = "python benchmarks/regret.py" + (f" --stores '{args.stores}'" if args.stores != "benchmarks/h200/*.db"
                                                else "")
    args.output.write_text(render(data, command, stores))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
