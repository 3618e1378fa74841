"""How good is the search? Samplers replayed over exhaustive records, on the CPU (writes benchmarks/search.md).

    python benchmarks/search.py benchmarks/h200/exhaustive_*.db -o benchmarks/search.md --seeds 20

Each argument is a store holding exhaustive sweeps (``tuner tune … --exhaustive``). For every template and
shape recorded there, the recorded subspace is the product of the values each parameter takes among the
recorded configs; its valid configs are enumerated (``SearchSpace.valid_configs``) and a record holding all
of them is exhaustive: its fastest recorded median is the exhaustive best. Stores are copied to a temporary
directory first (opening one may migrate it; the committed files are never touched).

Every strategy then runs as ``tuner tune`` runs it, with measurements answered by the replay device
(:class:`tuner.measure.devices.replay.ReplayMeasurer`: recorded statuses, timing noise drawn from the recorded
sample quantiles, 100 samples): the sampler of ``tuner.driver.samplers.make_sampler`` over the recorded
subspace, the warm starts of ``tuner.driver.study.order_warm_starts`` enqueued first, constraint violations
pruned without a trial, a config seen before not measured again, at most 200 such skips in a row, grid
exhaustion. Optuna's in-memory storage stands in for the store (a few thousand runs through SQLite would take
hours on this machine; the loop is the driver's, see ``simulate``). Strategies: tpe (startup 10, and 5/20 with
warm starts; variants of the driver's TPE with warm starts: univariate, 64 EI candidates),
random, cmaes, and grid order, each with three kinds of start: none (the sampler alone), seeds
(the space's default and expert seeds first, as a first shape is tuned) and warm (the default, then the
exhaustive bests of the record's other shapes, nearest first, as neighbouring shapes' published bests are, then
the seeds). Each runs for 40% of
the valid configs (at least 40 trials, at most all or 400), or until it has found the exhaustive best and
passed 20% of the space (the rest of its curve is then flat).

Reported per record and strategy, over the seeds: the best config found so far (its recorded median, relative
to the exhaustive best) after 5/10/20/40% of the valid configs, median and p10–p90; and the trials needed to
come within 3% of the exhaustive best (median, p90; ">N" when some seeds did not within the budget). For the
finalists: how often the best measured config (within 1%) is among the top k by measured value after 20% of
the space (the final round re-measures the top k).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import math
import multiprocessing
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner import db, registry  # noqa: E402
from tuner.driver.samplers import TPE_STARTUP_TRIALS, exhausted, make_sampler  # noqa: E402
from tuner.driver.study import order_warm_starts  # noqa: E402
from tuner.driver.trials import ENUMERABLE_VALID, looks_at_space, pick_unseen  # noqa: E402
from tuner.frozen import Config, Shape  # noqa: E402
from tuner.lookup import Entry  # noqa: E402
from tuner.measure.devices.replay import Record, ReplayMeasurer  # noqa: E402
from tuner.measure.protocol import Candidate, MeasureOptions  # noqa: E402
from tuner.space import SearchSpace  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.ERROR)

FRACTIONS = (0.05, 0.10, 0.20, 0.40)
WITHIN = 0.03  # "within 3% of the exhaustive best"
GOAL_FRACTION = 0.20
MAX_SKIPS = 200  # tuner.driver.trials.run_trials's default
MAX_VALID = 5000  # larger recorded subspaces are not exhaustive records (a sampled sweep over the whole space)
MAX_BUDGET = 400
FINALISTS = (1, 2, 3, 5)
NONE, SEEDS, WARM = "none", "seeds", "warm"  # measured first: nothing, default + seeds, default + neighbours + seeds
# Variants of the driver's TPE (tuner.driver.samplers.make_sampler: multivariate, constant liar) tried as
# defaults: Optuna TPESampler options over the driver's.
TPE_VARIANTS: dict[str, dict[str, object]] = {
    "tpe-univariate": {"multivariate": False},
    "tpe-ei64": {"n_ei_candidates": 64},
}
# (label, sampler name, TPE startup trials, start)
STRATEGIES: tuple[tuple[str, str, int, str], ...] = (
    *((name, name, TPE_STARTUP_TRIALS if name == "tpe" else 0, start)
      for name in ("tpe", "random", "cmaes", "grid") for start in (NONE, SEEDS, WARM)),
    ("tpe startup 5", "tpe", 5, WARM),
    ("tpe startup 20", "tpe", 20, WARM),
    ("tpe univariate", "tpe-univariate", TPE_STARTUP_TRIALS, WARM),
    ("tpe 64 EI candidates", "tpe-ei64", TPE_STARTUP_TRIALS, WARM),
)


def sampler_for(name: str, space: SearchSpace, seed: int, startup: int) -> optuna.samplers.BaseSampler:
    """The driver's sampler called ``name``, or one of :data:`TPE_VARIANTS`."""
    options = TPE_VARIANTS.get(name)
    if options is None:
        return make_sampler(name, space, seed, startup=startup)
    settings: dict[str, object] = {"multivariate": True, "constant_liar": True, **options}
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, **settings)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    """One recorded shape: its subspace, valid configs, recorded outcomes and neighbours' bests."""

    store: str
    template: str
    label: str
    shape: Shape
    space: SearchSpace
    record: Record
    valid: tuple[Config, ...]
    recorded: int  # valid configs with a recorded outcome
    best_us: float
    neighbours: tuple[Entry, ...]  # the other shapes' recorded bests

    @property
    def exhaustive(self) -> bool:
        return self.recorded == len(self.valid)

    @property
    def budget(self) -> int:
        return min(len(self.valid), max(40, math.ceil(0.4 * len(self.valid))), MAX_BUDGET)


@dataclass(frozen=True)
class Run:
    trace: tuple[float, ...]  # recorded median of the best config measured so far, after each trial (inf: none)
    finalists_needed: int | None  # after 20% of the space: top-k by measured value holding the best (within 1%)


def load_cases(paths: Sequence[Path], workdir: Path) -> tuple[list[Case], list[str]]:
    cases: list[Case] = []
    notes: list[str] = []
    for path in paths:
        copy = workdir / path.name
        db.copy_database(path, copy)  # with what a store in WAL mode holds in its -wal file
        store = db.Store.open(db.sqlite_url(copy))
        templates = sorted({s.template for s in store.list_studies()})
        for template in templates:
            try:
                full = registry.get(template).space()
            except Exception as exc:  # a record of a template this checkout does not know
                notes.append(f"{path.name}: {template} skipped ({type(exc).__name__}: {exc})")
                continue
            record = Record.load(store, template)
            configs = {c for outcomes in record.configs.values() for c in outcomes}
            carried = next((c for c in registry.get(template).spec.carries if c.version == record.version), None)
            if carried is not None and any(set(c) != set(full.names) for c in configs):
                # a record of a version the current one carries: its configs as the current version runs them
                # (the parameters it added, at the values that run an earlier config as that version did)
                record = dataclasses.replace(record, configs={
                    shape: {Config(carried.config(c)): r for c, r in outcomes.items()}
                    for shape, outcomes in record.configs.items()})
                configs = {c for outcomes in record.configs.values() for c in outcomes}
                added = ", ".join(f"{k}={v}" for k, v in carried.added)
                notes.append(f"{path.name}: {template}@{record.version} replayed as carried by version "
                             f"{registry.get(template).version} ({added})")
            if any(set(c) != set(full.names) for c in configs):
                notes.append(f"{path.name}: {template}@{record.version} skipped (its parameters differ from the "
                             "current search space)")
                continue
            only = {p.name: sorted({c[p.name] for c in configs}, key=p.choices.index) for p in full.params}
            space = full.subspace(only)
            bests = {s: record.best(s) for s in record.configs}
            for shape, outcomes in record.configs.items():
                best = bests[shape]
                if best is None:
                    notes.append(f"{path.name}: {template} {shape.key()} skipped (no OK config recorded)")
                    continue
                label = registry.get(template).workload_name(shape) or shape.key()
                valid = tuple(itertools.islice(space.valid_configs(shape), MAX_VALID + 1))
                if len(valid) > MAX_VALID:
                    notes.append(f"{path.name}: {template} {label} skipped (its recorded configs span a subspace of "
                                 f"more than {MAX_VALID} valid configs, {len(outcomes)} recorded: not exhaustive)")
                    continue
                neighbours = tuple(Entry(template, record.version, o.to_dict(), record.fingerprint.kind,
                                         record.fingerprint.device_name, b[0].to_dict())
                                   for o, b in bests.items() if o != shape and b is not None)
                cases.append(Case(path.name, template, label, shape, space, record, valid,
                                  sum(1 for c in valid if c in outcomes), best[1], neighbours))
    return cases, notes


def simulate(case: Case, sampler_name: str, startup: int, start: str, seed: int) -> Run:
    """One tuning run of ``case`` as tuner.driver.trials.run_trials runs it, measured by the replay device."""
    replay = ReplayMeasurer(case.record, MeasureOptions(n_samples=100))
    sampler = sampler_for(sampler_name, case.space, seed, startup)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    if start != NONE:
        for config in order_warm_starts(case.space, case.shape, case.neighbours if start == WARM else ()):
            study.enqueue_trial(config.to_dict())
    seen: dict[Config, float | None] = {}
    trace: list[float] = []
    best = math.inf
    skips = 0
    finalists_needed = None
    checkpoint = math.ceil(GOAL_FRACTION * len(case.valid))
    while len(trace) < case.budget and skips < MAX_SKIPS and not exhausted(sampler, study):
        trial = study.ask()
        config = case.space.suggest(trial)
        if case.space.check(config, case.shape) is not None or config in seen:
            if config in seen:  # known: the stored value, no measurement
                _tell(study, trial, seen[config])
            else:
                study.tell(trial, state=TrialState.PRUNED)
            skips += 1
            # the driver's look (tuner.driver.trials.unseen_config) over the replay's own record of the study
            if (looks_at_space(skips, sampler) and len(case.valid) <= ENUMERABLE_VALID
                    and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,))):
                unseen = pick_unseen(case.valid, seen, f"{seed}/{len(study.trials)}")
                if unseen is None:
                    break
                study.enqueue_trial(unseen.to_dict())
            continue
        skips = 0
        result = replay.measure(case.template, case.shape, Candidate(config=config), seed=seed * 100_003 + trial.number)
        seen[config] = result.median_us if result.ok else None
        _tell(study, trial, seen[config])
        outcome = case.record.outcome(case.shape, config)
        if outcome is not None and outcome.median_us is not None:
            best = min(best, outcome.median_us)
        trace.append(best)
        if len(trace) == checkpoint:
            finalists_needed = _finalists_needed(case, seen)
        if best <= case.best_us and len(trace) >= checkpoint:
            break  # the rest of the trace is the best itself: ratio_at reads it from the last entry
    return Run(tuple(trace), finalists_needed)


def _tell(study: optuna.Study, trial: optuna.Trial, value: float | None) -> None:
    if value is None:
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, value)


def _finalists_needed(case: Case, seen: dict[Config, float | None]) -> int | None:
    measured = sorted((v, c) for c, v in seen.items() if v is not None)
    truth = {c: case.record.outcome(case.shape, c) for _, c in measured}
    true_best = min((t.median_us for t in truth.values() if t and t.median_us), default=None)
    if true_best is None:
        return None
    for k, (_, config) in enumerate(measured, start=1):
        outcome = truth[config]
        if outcome and outcome.median_us is not None and outcome.median_us <= true_best * 1.01:
            return k
    return None


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    if math.isinf(ordered[hi]) or math.isinf(ordered[lo]):
        return ordered[hi] if pos - lo > 0 else ordered[lo]
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def trials_to_within(run: Run, best_us: float) -> float:
    for i, value in enumerate(run.trace, start=1):
        if value <= best_us * (1 + WITHIN):
            return float(i)
    return math.inf


def ratio_at(run: Run, trials: int, best_us: float) -> float:
    """Best found after ``trials`` over the exhaustive best; a run that stopped earlier (space exhausted,
    the skip limit, or the best found) keeps its last value."""
    if not run.trace:
        return math.inf
    return run.trace[min(trials, len(run.trace)) - 1] / best_us


@dataclass(frozen=True)
class Row:
    strategy: str
    start: str
    ratios: dict[float, tuple[float, float, float]]  # fraction -> (median, p10, p90) of best-found / best
    to_within: tuple[float, float, float]  # median, p10, p90 trials (inf: not within the budget)
    finalists: dict[int, float]  # k -> share of runs whose top k held the best measured config


_CASES: list[Case] = []  # what forked pool workers read (search spaces hold compiled code: not picklable)


def _runs(task: tuple[int, int, int]) -> list[Run]:
    case_index, strategy_index, seeds = task
    _, sampler, startup, start = STRATEGIES[strategy_index]
    return [simulate(_CASES[case_index], sampler, startup, start, seed) for seed in range(seeds)]


def evaluate(cases: list[Case], seeds: int, jobs: int) -> list[list[Row]]:
    """Every strategy on every case, ``seeds`` seeds each, in ``jobs`` forked processes."""
    _CASES[:] = cases
    tasks = [(c, s, seeds) for c in range(len(cases)) for s in range(len(STRATEGIES))]
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            results = pool.map(_runs, tasks, chunksize=1)
    else:
        results = [_runs(t) for t in tasks]
    by_task = dict(zip(tasks, results, strict=True))
    return [[_row(case, STRATEGIES[s], by_task[(c, s, seeds)]) for s in range(len(STRATEGIES))]
            for c, case in enumerate(cases)]


def _row(case: Case, strategy: tuple[str, str, int, str], runs: list[Run]) -> Row:
    n = len(case.valid)
    ratios = {}
    for f in FRACTIONS:
        values = [ratio_at(r, max(1, math.ceil(f * n)), case.best_us) for r in runs]
        ratios[f] = (statistics.median(values), quantile(values, 0.1), quantile(values, 0.9))
    needed = [trials_to_within(r, case.best_us) for r in runs]
    to_within = (quantile(needed, 0.5), quantile(needed, 0.1), quantile(needed, 0.9))
    ks = [r.finalists_needed for r in runs]
    finalists = {k: sum(1 for x in ks if x is not None and x <= k) / len(ks) for k in FINALISTS}
    return Row(strategy[0], strategy[3], ratios, to_within, finalists)


def _ratio(value: float) -> str:
    return "–" if math.isinf(value) else f"{value:.3f}"


def _trials(value: float, budget: int) -> str:
    return f">{budget}" if math.isinf(value) else f"{value:.0f}"


def render(results: list[tuple[Case, list[Row]]], notes: list[str], seeds: int, command: str, elapsed: float) -> str:
    lines = [
        "# Search quality: samplers replayed over exhaustive records",
        "",
        f"Generated by `{command}` on {datetime.date.today().isoformat()} ({platform.node()}, "
        f"Python {platform.python_version()}, Optuna {optuna.__version__}; {elapsed / 60:.1f} min). "
        "The method is in the docstring of `benchmarks/search.py`: every strategy is run as `tuner tune` runs "
        f"it, measurements answered by the replay device from the record, {seeds} seeds each. Figures: the "
        "recorded median of the best config found so far over the exhaustive best (1.000 = found it), median "
        "[p10–p90] over the seeds; trials to come within 3% of the exhaustive best, median [p10–p90] (\">N\": "
        "not within the budget of N trials for that share of seeds). Starts: none = the sampler alone; seeds = the "
        "space's default and expert seeds first; warm = the default, then the exhaustive bests of the record's "
        "other shapes, nearest first, then the seeds. CMA-ES models integer ranges only "
        "(and at least two of them): the spaces' categorical and power-of-two parameters go to its independent "
        "sampler, which is random search with the same seed, so where a subspace has fewer than two integer "
        "ranges its rows equal random's.",
        "",
    ]
    lines += _summary(results)
    for case, rows in results:
        n = len(case.valid)
        kind = "exhaustive" if case.exhaustive else f"partial: {case.recorded} of {n} valid configs recorded"
        lines += [
            f"## {case.template} — {case.label} ({case.store})",
            "",
            f"{n} valid configs in the recorded subspace ({kind}); exhaustive best {case.best_us:.3f} µs; "
            f"budget {case.budget} trials; subspace: {_subspace(case.space)}.",
            "",
            "| strategy | start | " + " | ".join(f"{f:.0%} ({max(1, math.ceil(f * n))})" for f in FRACTIONS)
            + " | trials to ≤3% | % of space | top-1/2/3/5 hold best at 20% |",
            "|---|---|" + "---|" * len(FRACTIONS) + "---|---|---|",
        ]
        for row in rows:
            cells = [f"{_ratio(m)} [{_ratio(lo)}–{_ratio(hi)}]" for m, lo, hi in (row.ratios[f] for f in FRACTIONS)]
            med, lo, hi = row.to_within
            share = "–" if math.isinf(med) else f"{med / n:.0%}"
            fin = "/".join(f"{row.finalists[k]:.0%}" for k in FINALISTS)
            lines.append(f"| {row.strategy} | {row.start} | " + " | ".join(cells)
                         + f" | {_trials(med, case.budget)} [{_trials(lo, case.budget)}–{_trials(hi, case.budget)}]"
                         + f" | {share} | {fin} |")
        lines.append("")
    if notes:
        lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(lines)


def _summary(results: list[tuple[Case, list[Row]]]) -> list[str]:
    lines = [
        "## Goal: TPE with warm starts within 3% of the exhaustive best in ≤ 20% of the valid space",
        "",
        "| template | shape | record | valid configs | 20% = trials | TPE warm: trials to ≤3%, median [p90] "
        "| met (median / p90) | alone, median trials: tpe / random / cmaes / grid | best other TPE setting, warm "
        "(median [p90]) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, rows in results:
        n = len(case.valid)
        limit = GOAL_FRACTION * n
        tpe = next(r for r in rows if r.strategy == "tpe" and r.start == WARM)
        med, _, p90 = tpe.to_within
        alone = " / ".join(_trials(next(r for r in rows if r.strategy == name and r.start == NONE).to_within[0],
                                   case.budget) for name in ("tpe", "random", "cmaes", "grid"))
        met = f"{'yes' if med <= limit else 'no'} / {'yes' if p90 <= limit else 'no'}"
        kind = "exhaustive" if case.exhaustive else f"partial ({case.recorded}/{n})"
        others = [r for r in rows if r.strategy.startswith("tpe ") and r.start == WARM]
        other = min(others, key=lambda r: (r.to_within[2], r.to_within[0]), default=None)
        variant = "–" if other is None else (f"{other.strategy}: {_trials(other.to_within[0], case.budget)} "
                                              f"[{_trials(other.to_within[2], case.budget)}]")
        lines.append(f"| {case.template} | {case.label} | {kind} | {n} | {math.ceil(limit)} | "
                     f"{_trials(med, case.budget)} [{_trials(p90, case.budget)}] | {met} | {alone} | {variant} |")
    lines.append("")
    return lines


def _subspace(space: SearchSpace) -> str:
    return ", ".join(f"{p.name}∈{{{','.join(map(str, p.choices))}}}" for p in space.params)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", nargs="+", type=Path, help="SQLite stores holding exhaustive sweeps")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("-o", "--output", type=Path, help="write the markdown here (default: stdout)")
    parser.add_argument("--jobs", type=int, default=1, help="processes (the figures do not depend on it)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        cases, notes = load_cases(args.stores, Path(tmp))
        for case in cases:
            print(f"{case.template} {case.label}: {len(case.valid)} valid configs", file=sys.stderr)
        results = list(zip(cases, evaluate(cases, args.seeds, args.jobs), strict=True))
    words = [*(str(p) for p in args.stores), "--seeds", str(args.seeds)]
    words += ["-o", str(args.output)] if args.output else []
    command = "python benchmarks/search.py " + " ".join(words)
    text = render(results, notes, args.seeds, command, time.monotonic() - started)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
