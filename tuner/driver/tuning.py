"""Tuning shapes one after another in this process (the CLI's ``tuner tune``), with a rich progress bar."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from tuner import registry
from tuner.driver import optuna_access
from tuner.driver.budget import CountBudget, DeadlineBudget, TrialBudget
from tuner.driver.exhaustive import ExhaustivePlan, ExhaustiveSampler, measured_configs
from tuner.driver.run import StudyOptions, run_study
from tuner.driver.study import FinalRound, StudyContext
from tuner.driver.trials import TrialRecord
from tuner.frozen import Config, Shape
from tuner.measure.compile_cache import CompilePool
from tuner.measure.contract import Measuring
from tuner.results import Status, comparator_names, merge_unmeasured_comparators, merged_label, reason_line
from tuner.store import TuningStore


@dataclass(frozen=True)
class ShapeSummary:
    label: str
    shape: Shape
    study_name: str
    trials: tuple[TrialRecord, ...]
    final: FinalRound


def tune_shapes(
    template: str,
    shapes: Sequence[tuple[str, Shape]],
    *,
    store: TuningStore,
    measurer: Measuring,
    trials: int,
    sampler: str = "tpe",
    seed: int | None = None,
    finalists: int = 3,
    comparators: bool = True,
    compile_workers: int = 0,
    console: Console | None = None,
    exhaustive: bool = False,
    only: Mapping[str, Sequence[object]] | None = None,
    device_index: int | None = None,
    time_limit: float | None = None,
) -> list[ShapeSummary]:
    """Tune each shape: ``trials`` measured trials, then the final round; returns one summary per shape.

    ``compile_workers`` (0: the host's cores when the template compiles in parallel, else 1): above 1,
    trials are asked in batches of that size and each batch compiled in a pool of that many processes.
    ``exhaustive``: instead of ``trials`` sampled trials, measure every valid config of the space (of the
    subspace ``only``: parameter -> the values it may take) that the study does not hold yet, then run the
    final round; ``sampler`` and ``seed`` are not used then. ``device_index`` is recorded with every
    measurement. ``time_limit`` (seconds per shape, counted from the start of that shape's sweep, before its
    study is opened): no new trial starts after it; the trials already started finish and the final round
    runs as usual. Raises what open_study raises, ConfigError for a bad ``only``, ValueError for a time
    limit that is not positive.
    """
    console = console or Console(quiet=True)
    workers = compile_workers or (os.cpu_count() or 1 if registry.get(template).compile_in_parallel else 1)
    options = StudyOptions(sampler=sampler, seed=seed, finalists=finalists, comparators=comparators,
                           device_index=device_index)
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(CompilePool(workers)) if workers > 1 else None
        return [
            _tune_one(template, label, shape, store=store, measurer=measurer, trials=trials, options=options,
                      pool=pool, console=console, time_limit=time_limit,
                      plan=ExhaustivePlan.of(registry.get(template).space(), shape, only) if exhaustive else None)
            for label, shape in shapes
        ]


def _tune_one(
    template: str, label: str, shape: Shape, *, store: TuningStore, measurer: Measuring, trials: int,
    options: StudyOptions, pool: CompilePool | None, console: Console, plan: ExhaustivePlan | None = None,
    time_limit: float | None = None,
) -> ShapeSummary:
    count = CountBudget(trials)
    budget: TrialBudget = count if time_limit is None else DeadlineBudget(count, time_limit)
    exhaustive = None if plan is None else ExhaustiveSampler(plan.configs)
    if exhaustive is not None:
        options = dataclasses.replace(options, sampler=exhaustive, warm=False)
    with _progress(console) as progress:
        task = progress.add_task(label, total=trials, best="–")
        best = [float("inf")]

        def on_open(ctx: StudyContext, task: TaskID = task) -> None:
            _say_resumed(console, label, ctx.study_id, store)
            if plan is not None and exhaustive is not None:
                count.n = _hold_known(ctx, store, plan, exhaustive, label, console)
                progress.update(task, total=count.n)

        def on_trial(record: TrialRecord, task: TaskID = task, best: list[float] = best) -> None:
            if record.median_us is not None and record.median_us < best[0]:
                best[0] = record.median_us
                progress.update(task, best=f"{best[0]:.2f} µs")
            if record.measured:
                progress.advance(task)

        def final_round(task: TaskID = task) -> bool:
            cut = isinstance(budget, DeadlineBudget) and budget.expired
            progress.update(task, description=f"{label}: final round", total=count.used if cut else count.n)
            return True

        run = run_study(template, shape, store=store, measurer=measurer, budget=budget, options=options,
                        pool=pool, on_open=on_open, on_trial=on_trial, take_final_round=final_round)
    assert run.final is not None  # never stopped, and the final round is always ours
    if isinstance(budget, DeadlineBudget) and budget.expired:
        console.print(f"[bold]{label}[/bold]: time limit of {time_limit:g} s reached after {count.used} of "
                      f"{count.n} measured trials; final round run on those")
    summary = ShapeSummary(label, shape, run.ctx.key.study_name(), run.trials, run.final)
    _print_summary(console, summary)
    return summary


def _hold_known(
    ctx: StudyContext, store: TuningStore, plan: ExhaustivePlan, exhaustive: ExhaustiveSampler, label: str,
    console: Console,
) -> int:
    """Hand the exhaustive sampler what the study holds already; the number of trials left to run."""
    measured = measured_configs(store, ctx.study_id)
    queued = [Config(optuna_access.queued_params(t))
              for t in optuna_access.waiting_trials(ctx.study)]
    exhaustive.hold(measured | set(queued))
    done = sum(1 for c in plan.configs if c in measured)
    console.print(f"[bold]{label}[/bold]: exhaustive, {plan.describe()}; {done} measured already, "
                  f"{exhaustive.remaining()} to measure" + (f" (+{len(queued)} queued)" if queued else ""))
    return exhaustive.remaining() + len(queued)


def _say_resumed(console: Console, label: str, study_id: int, store: TuningStore) -> None:
    """Whether the sweep starts a study or resumes one (and with how many measured trials)."""
    stored = store.count_measurements(study_id=study_id, role="trial")
    if stored:
        # invalid configs are stored as trials too (pruned unmeasured): counted apart, as the summary does
        invalid = store.count_measurements(study_id=study_id, role="trial", status=Status.INVALID)
        console.print(f"[bold]{label}[/bold]: resuming study {study_id} ({stored - invalid} measured trials stored"
                      + (f", {invalid} invalid configs pruned)" if invalid else ")"))
    else:
        console.print(f"[bold]{label}[/bold]: new study {study_id}")


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("fastest trial {task.fields[best]}"),  # the sweep's; the published best is the final round's
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _print_summary(console: Console, s: ShapeSummary) -> None:
    failed = sum(1 for r in s.trials if r.measured and r.status.value != "OK")
    invalid = sum(1 for r in s.trials if r.status.value == "INVALID")
    dups = sum(1 for r in s.trials if r.duplicate_of is not None)
    measured = [r for r in s.trials if r.measured]
    overhead = sorted(r.overhead_s for r in measured)
    med_overhead = overhead[len(overhead) // 2] * 1e3 if overhead else 0.0
    console.print(
        f"[bold]{s.label}[/bold]: {len(measured)} measured trials ({failed} failed), {invalid} invalid pruned, "
        f"{dups} duplicates; median per-trial overhead {med_overhead:.1f} ms"
    )
    # A config has no spaces to wrap at: folded, not cut with an ellipsis, so that a log of a narrow or piped
    # console still tells the finalists apart.
    # where the round's time went: the parallel prebuild (the pool), then the measuring process's call
    prebuilt = f"prebuild {s.final.prebuild_s:.1f} s, " if s.final.prebuild_s else ""
    table = Table("candidate", Column("config", overflow="fold"), Column("status", overflow="fold"), "median µs",
                  "p20–p80 µs", Column("reason", overflow="fold"),
                  title=f"final round ({prebuilt}measured in {s.final.measure_s:.1f} s)")
    rows = merge_unmeasured_comparators(s.final.entries, label=lambda e: e.label,
                                        status=lambda e: e.result.status.value, reason=lambda e: e.result.reason)
    for e, labels in rows:
        r = e.result
        spread = f"{r.summary.p20_us:.2f}–{r.summary.p80_us:.2f}" if r.summary else ""
        config = json.dumps(r.config.to_dict(), separators=(",", ":")) if r.config else ""
        reason = reason_line(r.reason)
        median = f"{r.median_us:.2f}" if r.median_us is not None else ""
        if len(labels) > 1:  # comparators merged (unmeasured, one reason): their names where a config would be
            config = comparator_names(labels)
        table.add_row(merged_label(labels, names=False), config, r.status.value, median, spread, reason)
    console.print(table)
    if s.final.measure_times is not None:
        console.print(f"{s.label}: final round's measuring call: {s.final.measure_times.describe()}", highlight=False)
    if s.final.winner is not None:
        w = s.final.winner.result
        kept = s.final.kept_over
        why = (f" (the config served before the round, kept: the fastest, {kept.result.median_us:.2f} µs, was not "
               "clearly faster)" if kept is not None and kept.result.median_us is not None else "")
        console.print(f"best config for {s.label}: {json.dumps(w.config.to_dict())} at {w.median_us:.2f} µs "
                      f"({w.timer}) — {'published' if s.final.published else 'not published'}{why}")
    else:
        console.print(f"[yellow]no config passed the gate for {s.label}; nothing published[/yellow]")
