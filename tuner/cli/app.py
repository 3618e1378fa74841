"""The ``tuner`` command line (Typer). One error boundary: user and infrastructure errors become a one-line
message on stderr and exit code 2; nothing is written to the store before the input has been validated."""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import json
import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from tuner.errors import DeviceError, StoreError, TunerError, UserInputError

if TYPE_CHECKING:
    from tuner.dims import Dim

app = typer.Typer(
    name="tuner",
    help="Kernel autotuning: sweep a kernel template per shape, verify, time on the device, store, serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


def _full_console() -> Console:
    """The console on a terminal; for a file or a pipe, one wide enough that every character of a table
    gets through (rich would cut cells at 80 columns)."""
    return console if console.is_terminal else Console(width=100_000)
F = TypeVar("F", bound=Callable[..., Any])

TemplateArg = Annotated[str, typer.Argument(help="Template name (see `tuner templates`).")]
WorkloadOpt = Annotated[list[str], typer.Option("--workload", "-w", help="Named workload (repeatable).")]
ShapeOpt = Annotated[list[str], typer.Option("--shape", "-s", help="Explicit shape, e.g. B=1,S=4096,H=48.")]
DbOpt = Annotated[str | None, typer.Option("--db", help="SQLAlchemy URL (default: $TUNER_DB_URL or the SQLite file).")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cuda | npu | cpu")]


def boundary(fn: F) -> F:
    """Translate TunerError into a one-line message (never wrapped, whatever the terminal width) and an exit code
    (2: bad input or unreachable store)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (UserInputError, StoreError, DeviceError) as exc:
            err_console.print(f"[red]error:[/red] {_one_line(exc)}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except TunerError as exc:
            err_console.print(f"[red]error:[/red] {_one_line(exc)}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """An output file the user named that cannot be written (no such folder, no permission, a full disk) is a
    one-line error and exit code 2, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise UserInputError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0] if "\n" in text else text


def _store(url: str | None, *, migrate: bool = True):
    from tuner import db
    from tuner.settings import engine_settings

    return db.Store.open(url or engine_settings().db_url, migrate_schema=migrate)


@app.command()
@boundary
def templates() -> None:
    """List the registered templates with their workloads and parameters; one error line for each template
    that does not load (exit code 2 if any)."""
    from tuner import registry

    table = Table("template", "version", "backend", "shape dims (--shape)", "parameters", "workloads")
    table.columns[0].no_wrap = True  # the names tell templates apart: never cut them
    for column in table.columns[3:]:
        column.overflow = "fold"  # wrapped, never cut with an ellipsis (a workload's name is an argument)
    failed = 0
    for name in registry.names():
        try:
            t = registry.spec(name)
            space = t.space()
        except UserInputError as exc:
            err_console.print(f"[red]error:[/red] {_one_line(exc)}", highlight=False, soft_wrap=True)
            failed += 1
            continue
        table.add_row(name, t.version, t.backend, ", ".join(_dim_text(d) for d in t.dims), ", ".join(space.names),
                      "\n".join(w.name for w in t.workloads))
    console.print(table)
    if failed:
        raise typer.Exit(2)


def _waiting_line(job: Mapping[str, Any]) -> str:
    """Why a job waits (the API's ``waiting``), with what to do when no worker of its device is live."""
    hint = ("; on a host without a GPU, submit with --device cpu"
            if job["device"]["kind"] != "cpu" and job.get("waiting_cause") == "no_device" else "")
    return f"waiting: {job['waiting']}{hint}"


def _dim_text(dim: Dim) -> str:
    """A shape dim as ``--shape`` takes it: ``S`` (required), ``Q=256`` (its default), and a choice dim's
    other values in parentheses: ``dtype=float16 (bfloat16, float32)``."""
    text = dim.name if dim.default is None else f"{dim.name}={str(dim.default).lower()}"
    others = [c for c in dim.choices or () if c != dim.default]
    return f"{text} ({', '.join(others)})" if others else text


@app.command()
@boundary
def tune(
    template: TemplateArg,
    workload: WorkloadOpt = [],  # noqa: B006 - Typer reads list defaults, never mutates them
    shape: ShapeOpt = [],  # noqa: B006
    all_workloads: Annotated[bool, typer.Option("--all-workloads", help="Every workload of the template.")] = False,
    trials: Annotated[int, typer.Option("--trials", "-n", min=1, max=100_000, help="Measured trials per shape.")] = 40,
    device: Annotated[str, typer.Option(
        "--device", help="auto | cuda | npu | cpu | replay (measurements answered from --record)")] = "auto",
    sampler: Annotated[str, typer.Option(help="tpe | random | grid | cmaes")] = "tpe",
    db_url: DbOpt = None,
    samples: Annotated[int, typer.Option(min=1, max=100_000, help="Timed samples per candidate.")] = 100,
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds per candidate before TIMEOUT.")] = 120.0,
    finalists: Annotated[int, typer.Option(min=1, max=50, help="Configs re-measured in the final round.")] = 3,
    comparators: Annotated[bool, typer.Option(help="Measure the template's comparators in the final round.")] = True,
    seed: Annotated[int | None, typer.Option(help="Sampler seed.")] = None,
    compile_workers: Annotated[int, typer.Option(
        min=0, help="Parallel compile processes (0: all cores for templates that compile slowly, else 1).")] = 0,
    exhaustive: Annotated[bool, typer.Option(
        "--exhaustive", help="Measure every valid config (of the --only subspace) the study lacks; resumable. "
        "Ignores --trials, --sampler and --seed.")] = False,
    only: Annotated[list[str], typer.Option(
        "--only", help="With --exhaustive: restrict a parameter to these values, NAME=V1,V2 (repeatable).")] = [],  # noqa: B006
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="With --exhaustive: print each shape's count of valid configs and exit.")] = False,
    record: Annotated[str | None, typer.Option(
        "--record", help="With --device replay: the store (SQLAlchemy URL) whose measurements answer.")] = None,
    time_limit: Annotated[float | None, typer.Option(
        "--time-limit", min=0.001, help="Seconds per shape after which no new trial starts; the trials started "
        "finish and the final round runs (a sweep cut by `timeout` publishes nothing).")] = None,
) -> None:
    """Sweep TEMPLATE for each shape, publish the best verified config, and print the report.

    With --exhaustive, every valid config is measured once (running the command again continues the sweep);
    the count of valid configs is printed per shape before anything is measured. With --device replay, every
    measurement is answered from the --record store (no kernel runs): samplers and defaults compared on the CPU."""
    from tuner import registry
    from tuner.driver.exhaustive import ExhaustivePlan, parse_only
    from tuner.driver.samplers import SAMPLERS
    from tuner.driver.tuning import tune_shapes
    from tuner.measure.devices.base import DeviceSpec
    from tuner.measure.devices.kinds import resolve
    from tuner.measure.devices.replay import Record, ReplayMeasurer
    from tuner.measure.measurer import MeasureOptions, Measurer
    from tuner.report.markdown import collect, render_markdown
    from tuner.shapes import select_shapes

    t = registry.get(template)
    space = t.space()  # validate the search-space file before anything is written
    selected = select_shapes(t, workloads=workload, shapes=shape, all_workloads=all_workloads)
    if (only or dry_run) and not exhaustive:
        raise UserInputError("--only and --dry-run go with --exhaustive")
    subspace = parse_only(only, space)
    if dry_run:
        for label, the_shape in selected:
            console.print(f"{label}: {ExhaustivePlan.of(space, the_shape, subspace).describe()}", highlight=False,
                          soft_wrap=True)
        return
    if sampler not in SAMPLERS:
        raise UserInputError(f"unknown sampler {sampler!r}; known: {', '.join(SAMPLERS)}")
    if device not in ("auto", "cuda", "npu", "cpu", "replay"):
        raise UserInputError(f"unknown device {device!r}; expected auto, cuda, npu, cpu or replay")
    if (record is None) != (device != "replay"):
        raise UserInputError("--device replay needs --record URL, and --record needs --device replay")
    options = MeasureOptions(n_samples=samples, timeout_s=timeout)
    measurer: ReplayMeasurer | Measurer
    kind: str
    if record is not None:
        measurer = ReplayMeasurer(Record.load(_store(record, migrate=False), t.name), options)
        kind = measurer.record.fingerprint.kind
        compile_workers = 1  # nothing is compiled
    else:
        spec = resolve(DeviceSpec(device))  # type: ignore[arg-type]
        measurer, kind = Measurer(spec, options), spec.kind
    store = _store(db_url)
    out = _full_console()  # a log gets whole configs and reasons
    out.print(f"store: {store.url}", highlight=False)
    _stop_on_sigterm()
    with measurer:
        tune_shapes(
            t.name, selected, store=store, measurer=measurer, trials=trials, sampler=sampler, seed=seed,
            finalists=finalists, comparators=comparators, compile_workers=compile_workers, console=out,
            exhaustive=exhaustive, only=subspace, device_index=None if record is not None else spec.index,
            time_limit=time_limit,
        )
    out.print()
    out.print(render_markdown(collect(store, t.name, device_kind=kind)), markup=False, highlight=False)


def _stop_on_sigterm() -> None:
    """SIGTERM ends the command as Ctrl-C does (:func:`_interrupted`), after every thread's Python stack is
    written to stderr: a run that a `timeout` had to stop says where it was waiting (a `tuner tune` on the
    H200 printed its published best, then did not exit for 31 s; its log said nothing about why)."""
    # registered afresh each time: a later signal.signal (another command run in this process, the worker's)
    # replaces faulthandler's handler, which register() alone would not put back
    faulthandler.unregister(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        fd = sys.__stderr__.fileno()  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):  # no stderr of its own (embedded, captured): no dump
        return
    faulthandler.register(signal.SIGTERM, file=fd, all_threads=True, chain=True)


def _interrupted(signum: int, _frame: object) -> None:
    """SIGTERM (``timeout``, a batch system) ends a sweep as Ctrl-C does: the trial being measured and
    those waiting for it are failed and queued again for the study's next run, the measurer stops."""
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def _one_shape(template: str, workload: list[str], shape: list[str]):
    from tuner import registry
    from tuner.shapes import select_shapes

    t = registry.spec(template)
    selected = select_shapes(t, workloads=workload, shapes=shape)
    if len(selected) != 1:
        raise UserInputError("give exactly one --workload or --shape")
    return t, selected[0][1]


@app.command()
@boundary
def verify(
    template: TemplateArg,
    workload: WorkloadOpt = [],  # noqa: B006
    shape: ShapeOpt = [],  # noqa: B006
    all_workloads: Annotated[bool, typer.Option("--all-workloads", help="Every workload of the template.")] = False,
    processes: Annotated[int, typer.Option(min=1, max=50, help="Fresh measurement processes per shape.")] = 5,
    device: DeviceOpt = "auto",
    db_url: DbOpt = None,
    samples: Annotated[int, typer.Option(min=1, max=100_000, help="Timed samples per candidate.")] = 100,
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds per candidate before TIMEOUT.")] = 120.0,
    comparators: Annotated[bool, typer.Option(help="Re-measure the template's comparators too.")] = True,
    comparator_processes: Annotated[int | None, typer.Option(
        min=1, help="Re-measure the comparators in only the first N processes (default: all).")] = None,
    tolerance: Annotated[float, typer.Option(min=0.001, max=1.0, help="Drift flagged beyond ± this fraction.")] = 0.03,
    stand_ins: Annotated[int, typer.Option(
        min=0, max=20, help="After a disproval, verify the config published in its place too, up to N times "
        "(each one as long as the first, comparators included).")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object per verification.")] = False,
) -> None:
    """Re-measure the published best (and the comparators) in fresh processes; record and print the drift.

    A best that gives wrong results on a process's fresh inputs is disproved: the fastest other config of the
    round that published it takes its place (or the best is withdrawn), and that stand-in is verified in turn
    (``--stand-ins``, default 3: how many in a row). Exit code 3 when some verification flagged its best: a
    drift beyond the tolerance, wrong results, or no process measured it."""
    from tuner import registry
    from tuner.driver.reverify import verify_served
    from tuner.measure.devices.base import DeviceSpec
    from tuner.measure.devices.kinds import resolve
    from tuner.measure.measurer import MeasureOptions
    from tuner.shapes import select_shapes

    t = registry.get(template)
    selected = select_shapes(t, workloads=workload, shapes=shape, all_workloads=all_workloads)
    if device not in ("auto", "cuda", "npu", "cpu"):
        raise UserInputError(f"unknown device {device!r}; expected auto, cuda, npu or cpu")
    spec = resolve(DeviceSpec(device))  # type: ignore[arg-type]
    store = _store(db_url)
    options = MeasureOptions(n_samples=samples, timeout_s=timeout)
    _stop_on_sigterm()
    flagged = 0
    for label, the_shape in selected:
        chain = verify_served(store, t.name, the_shape, stand_ins=stand_ins, device=spec, processes=processes,
                              options=options, comparators=comparators, comparator_processes=comparator_processes,
                              tolerance=tolerance)
        for outcome, verified_next in chain:
            flagged += outcome.verdict.flagged
            if as_json:
                print(json.dumps({**_verification_json(label, outcome), "stand_in_verified": verified_next}),
                      flush=True)
            else:
                _print_verification(label, outcome)
                if verified_next is False:
                    console.print(f"[yellow]{label}: --stand-ins {stand_ins} reached: the config published in its "
                                  "place is served unverified; run `tuner verify` again to verify it[/yellow]")
    if flagged:
        raise typer.Exit(3)


def _verification_json(label: str, outcome: Any) -> dict[str, Any]:
    v, r = outcome.verdict, outcome.record
    return {
        "label": label, "template": outcome.template, "shape": outcome.shape.to_dict(),
        "config": json.loads(outcome.best.config_json), "study_id": r.study_id, "verification_id": r.id,
        "stored_us": v.stored_us, "median_us": v.median_us, "low_us": v.low_us, "high_us": v.high_us,
        "drift": v.drift, "tolerance": v.tolerance, "flagged": v.flagged, "processes": r.figures,
        "fingerprint": json.loads(r.fingerprint_json), "study_fingerprint": outcome.best.fingerprint_hash,
        "verified_at": r.created_at.isoformat(), "wrong_processes": v.wrong, "withdrawn": outcome.withdrawn,
        "replacement": None if outcome.replacement is None else {
            "config": json.loads(outcome.replacement.config_json), "median_us": outcome.replacement.median_us},
    }


def _print_verification(label: str, outcome: Any) -> None:
    from tuner.results import merge_unmeasured_comparators, merged_label, reason_line

    table = Table("process", "candidate", "status", "median µs", "p20–p80 µs", "stored µs", "ratio",
                  title=f"{label}: {len(outcome.processes)} fresh process(es)", title_justify="left")
    for process in outcome.processes:
        rows = merge_unmeasured_comparators(process.candidates, label=lambda c: c.label, status=lambda c: c.status,
                                            reason=lambda c: c.reason)
        for c, labels in rows:
            spread = f"{c.p20_us:.2f}–{c.p80_us:.2f}" if c.p20_us is not None and c.p80_us is not None else ""
            table.add_row(str(process.process), merged_label(labels), c.status, _fmt_us(c.median_us), spread,
                          _fmt_us(c.stored_us) if len(labels) == 1 else "",  # each merged one has its own
                          f"{c.ratio:.3f}" if c.ratio is not None else reason_line(c.reason))
    console.print(table)
    v = outcome.verdict
    if v.wrong:
        from tuner.driver.reverify import disproval_text

        console.print(f"[red]{label}: {disproval_text(outcome)}; recorded as verification {outcome.record.id}[/red]")
        return
    if v.median_us is None:
        console.print(f"[red]{label}: the best config did not measure OK in any process — flagged[/red]")
        return
    word = "[red]DRIFT — flagged[/red]" if v.flagged else "[green]within tolerance[/green]"
    console.print(f"{label}: best {_fmt_us(v.median_us)} µs (median of {len(outcome.processes)} processes, "
                  f"{_fmt_us(v.low_us)}–{_fmt_us(v.high_us)}), stored {_fmt_us(v.stored_us)} µs: drift "
                  f"{100 * (v.drift or 0):+.1f}% (±{100 * v.tolerance:g}%) {word}; recorded as verification "
                  f"{outcome.record.id}")


def _fmt_us(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


@app.command()
@boundary
def best(
    template: TemplateArg,
    workload: WorkloadOpt = [],  # noqa: B006
    shape: ShapeOpt = [],  # noqa: B006
    device: Annotated[str | None, typer.Option(
        help="Device kind to look up (default: any; --lookup needs it).")] = None,
    device_name: Annotated[str | None, typer.Option(
        help="With --lookup: the device name asking (its entries first; another device's answer is nearest).")] = None,
    lookup: Annotated[bool, typer.Option(
        "--lookup", help="Answer as GET /v1/best does for any shape: exact, else the nearest shape's config (the "
        "gain gate, repairs and notes), else the search space's default.")] = False,
    db_url: DbOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print the best verified config served for exactly this shape, as `GET /v1/best` answers it: the
    template version's own best, else a carried version's (its config completed, ``measured_version`` saying
    which; repaired where the current constraints reject it). With --lookup, any shape: `GET /v1/best`'s
    whole answer (a nearest shape's best, or the default) with the lookup's notes and differences."""
    from tuner.lookup import Requester, answer_fields
    from tuner.store.entries import exact_answer, lookup_answer, served_entries

    t, the_shape = _one_shape(template, workload, shape)
    space = t.space()
    if lookup:
        if device is None:
            raise UserInputError("--lookup needs --device (cuda, npu or cpu): the lookup serves one device kind")
        entries = [e for _, e in served_entries(_store(db_url), template=t.name, version=t.version,
                                                carries=t.carries, device_kind=device, admits=space.in_domain)]
        answer = lookup_answer(entries, shape=the_shape, space=space, version=t.version,
                               requester=Requester(device_name=device_name, backend=t.backend))
    else:
        found = exact_answer(_store(db_url), template=t.name, version=t.version, carries=t.carries, space=space,
                             shape=the_shape, device_kind=device)
        if found is None:  # exact_answer answers only from an entry of the shape
            raise UserInputError(f"no best config stored for {t.name} at {the_shape.key()}"
                                 + (f" on {device}" if device else "") + "; run `tuner tune` first, or ask with "
                                 "--lookup --device KIND for what `GET /v1/best` serves (a nearest shape's best "
                                 "or the default)")
        answer = found
    # The fields of `GET /v1/best`'s answer (api/schemas.py BestOut) for this shape, from the same function.
    data = answer_fields(answer, template=t.name, version=t.version, shape=the_shape.to_dict(),
                         shape_key=the_shape.key(), device_kind=device)
    if as_json:
        print(json.dumps(data, indent=2))
        return
    table = Table(show_header=False)
    for k, v in data.items():
        table.add_row(k, json.dumps(v, ensure_ascii=False) if isinstance(v, dict | list) else str(v))
    console.print(table)


@app.command()
@boundary
def rejudge(
    template: TemplateArg,
    workload: WorkloadOpt = [],  # noqa: B006
    shape: ShapeOpt = [],  # noqa: B006
    device: Annotated[str | None, typer.Option(help="Device kind (default: any).")] = None,
    apply: Annotated[bool, typer.Option(
        "--apply", help="Publish the rule's config where it differs from the published best (default: only show).")]
    = False,
    db_url: DbOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Replay today's publishing rule over the stored final rounds of the template's current version (every
    shape, or those named) and show where it would serve another config than the published best; with
    --apply, publish it. Nothing is measured: the rule's config keeps the figures of the latest round it ran
    in. A final round keeps the config served before it unless the round's fastest is clearly faster (its p80
    under the served config's median); bests published before that rule may have changed on noise."""
    from tuner import registry
    from tuner.driver.rejudge import rejudge_template
    from tuner.shapes import select_shapes

    if device is not None and device not in ("cuda", "npu", "cpu"):
        raise UserInputError(f"unknown device {device!r}; expected cuda, npu or cpu")
    t = registry.get(template)  # the space and error bounds a round of today judges by
    keys = {s.key() for _, s in select_shapes(t, workloads=workload, shapes=shape)} if workload or shape else None
    found = rejudge_template(_store(db_url), t, device_kind=device, shape_keys=keys, apply=apply)
    rows: list[dict[str, Any]] = []
    for r in found:
        best, pick = r.best, r.replayed.row
        rows.append({
            "study_id": r.study.id, "shape_key": r.study.shape_key, "device_kind": r.study.device_kind,
            "device_name": r.study.device_name, "rounds": r.replayed.rounds, "kept": r.replayed.kept,
            "published": best.config if best else None, "published_us": best.median_us if best else None,
            "rule": dict(r.replayed.config) if r.replayed.config is not None else None,
            "rule_us": pick.median_us if pick else None, "rule_measurement_id": pick.id if pick else None,
            "changed": r.changed, "applied": r.applied,
            "published_measurement_id": r.published.measurement_id if r.published else None,
        })
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{t.name} {t.version}: published best against today's rule over the stored rounds")
    for column in ("shape", "device", "rounds", "kept", "published (µs)", "rule's config (µs)", ""):
        table.add_column(column)
    for row in rows:
        rule, published = row["rule"] or {}, row["published"] or {}
        differs = ", ".join(f"{k}={v}" for k, v in rule.items() if published.get(k) != v)
        table.add_row(
            row["shape_key"], f"{row['device_kind']} {row['device_name']}", str(row["rounds"]), str(row["kept"]),
            _fmt_us(row["published_us"]), f"{differs} ({_fmt_us(row['rule_us'])})" if row["changed"] else "same",
            "published" if row["applied"] else "differs" if row["changed"] else "")
    _full_console().print(table)
    differ = sum(r["changed"] for r in rows)
    applied = sum(r["applied"] for r in rows)
    if apply and applied < differ:
        err_console.print(f"{differ - applied} not re-published: their best changed, or the rule's config was "
                          "disproved, since they were read", soft_wrap=True, highlight=False)
    err_console.print(f"{len(rows)} studies with a published best, {differ} differ from the rule"
                      + (f", {applied} re-published" if apply else " (--apply publishes the rule's config)"),
                      soft_wrap=True, highlight=False)


@app.command()
@boundary
def history(
    template: TemplateArg,
    workload: WorkloadOpt = [],  # noqa: B006
    shape: ShapeOpt = [],  # noqa: B006
    all_workloads: Annotated[bool, typer.Option("--all-workloads", help="Every workload of the template.")] = False,
    device: Annotated[str | None, typer.Option(help="Device kind (default: any).")] = None,
    db_url: DbOpt = None,
    role: Annotated[str | None, typer.Option(help="trial | final (default: both).")] = None,
    status: Annotated[list[str], typer.Option(
        "--status", help="Only this status (repeatable, or comma-separated): OK, INVALID, COMPILE_ERROR, …")] = [],  # noqa: B006
    sort: Annotated[str, typer.Option(
        help="id, trial_number, median_us, status or created_at; a leading '-' sorts descending.")] = "id",
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many measurements per study.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON: one object per study.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV: one row per measurement.")] = False,
) -> None:
    """Show the measurements of the shapes' studies, failures with their reasons (full configs when stdout is
    not a terminal)."""
    from tuner import registry
    from tuner.cli import explore
    from tuner.shapes import select_shapes

    statuses = explore.check_filters(role, status, sort)
    if as_json and as_csv:
        raise UserInputError("give --json or --csv, not both")
    t = registry.get(template)
    selected = select_shapes(t, workloads=workload, shapes=shape, all_workloads=all_workloads)
    sections = explore.history(_store(db_url), t.name, selected, device=device, role=role, statuses=statuses,
                               sort=sort, limit=limit)
    if as_json or as_csv:
        sys.stdout.write((explore.history_json(sections) + "\n") if as_json else explore.history_csv(sections))
        return
    out = _full_console()
    for table in explore.history_tables(sections):
        out.print(table)


@app.command()
@boundary
def studies(
    template: Annotated[str | None, typer.Argument(help="Only this template's studies.")] = None,
    device: Annotated[str | None, typer.Option(help="Device kind (default: any).")] = None,
    db_url: DbOpt = None,
    limit: Annotated[int, typer.Option(min=1, max=100_000, help="At most this many studies.")] = 200,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the studies in the store, newest first: shape, device, trials, best, last activity."""
    from tuner import registry
    from tuner.cli import explore
    from tuner.frozen import Shape

    if template is not None:
        registry.get(template)  # an unknown name is an error, not an empty list
    if device is not None and device not in ("cuda", "npu", "cpu"):
        raise UserInputError(f"unknown device {device!r}; expected cuda, npu or cpu")
    rows = []
    for s in explore.studies(_store(db_url), template=template, device=device, limit=limit):
        try:
            label = registry.get(s.study.template).workload_name(Shape.from_json(s.study.shape_json))
        except (TunerError, ImportError, AttributeError):
            label = None  # a template this process does not know (registered elsewhere)
        rows.append((s, label or s.study.shape_key))
    if as_json:
        print(json.dumps([explore.study_dict(s, label) for s, label in rows], indent=2))
        return
    _full_console().print(explore.studies_table(rows))


@app.command()
@boundary
def report(
    templates: Annotated[list[str], typer.Argument(help="Template(s); several: one row per workload, best of all.")],
    device: Annotated[str | None, typer.Option(help="Device kind (default: all).")] = None,
    db_url: DbOpt = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the markdown to this file.")] = None,
    title: Annotated[str | None, typer.Option(help="Title of a multi-template report.")] = None,
    errors: Annotated[bool, typer.Option("--errors", help="Add each output's relative error (one template).")] = False,
    kernels: Annotated[bool, typer.Option(
        "--kernels", help="Add the device time per kernel, where the timer saw kernels (one template).")] = False,
    regret: Annotated[bool, typer.Option(
        "--regret", help="Add the nearest-shape regret of the lookup (`tuner regret`; one template).")] = False,
    verifications: Annotated[bool, typer.Option(
        "--verifications", help="Instead: the latest `tuner verify` of each row's best, per process.")] = False,
) -> None:
    """Markdown report: per workload, best vs default vs comparators, geometric means, roofline."""
    from tuner import registry
    from tuner.report.markdown import collect, render_comparison, render_markdown, render_verifications

    for name in templates:
        registry.get(name)
    if (errors or kernels or regret) and len(templates) > 1:
        raise UserInputError(f"{'--errors' if errors else '--kernels' if kernels else '--regret'} takes one template")
    store = _store(db_url)
    reports = [collect(store, name, device_kind=device) for name in templates]
    if verifications:
        text = render_verifications(reports, title=title)
    elif len(reports) == 1:
        text = render_markdown(reports[0], errors=errors, kernels=kernels)
    else:
        text = render_comparison(reports, title=title)
    if regret:
        from tuner.service import regret as regrets

        found = regrets.regret_reports(regrets.recorded_shapes(store, template=templates[0], device_kind=device),
                                       space_of=regrets.registered_space(templates[0]))
        text += "\n" + regrets.render_markdown(found)
    if output:
        with _writing(output):
            output.write_text(text)
        err_console.print(f"wrote {output}")
    else:
        sys.stdout.write(text)


@app.command()
@boundary
def regret(
    template: TemplateArg,
    device: Annotated[str | None, typer.Option(help="Device kind (default: all).")] = None,
    distance: Annotated[str | None, typer.Option(
        help="A candidate distance of tuner.distance (default: the lookup's).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    measure: Annotated[bool, typer.Option(
        "--measure", help="Measure here the served configs the records lack (with the shape's best).")] = False,
    samples: Annotated[int, typer.Option(min=1, max=100_000, help="With --measure: samples per candidate.")] = 100,
    db_url: DbOpt = None,
) -> None:
    """Nearest-shape regret: for every shape with its own best, what the lookup would serve without it,
    timed from the store's records, against the shape's own best (leave-one-out; nothing is measured unless
    --measure: then served configs the records lack are measured here, interleaved with the shape's best)."""
    from tuner import distance as distances
    from tuner.service import regret as regrets

    space_of = regrets.registered_space(template)
    try:
        chosen = distances.candidate(distance) if distance else distances.DEFAULT_DISTANCE
    except KeyError as exc:
        raise UserInputError(str(exc.args[0])) from None
    shapes = regrets.recorded_shapes(_store(db_url), template=template, device_kind=device)
    reports = regrets.regret_reports(shapes, space_of=space_of, distance=chosen)
    if measure:
        reports = _measure_regret(template, device, samples, reports, shapes)
    if as_json:
        sys.stdout.write(json.dumps([r.to_dict() for r in reports], indent=1) + "\n")
    else:
        sys.stdout.write(regrets.render_markdown(reports) or f"no published best configs of {template}\n")


def _measure_regret(template: str, device: str | None, samples: int, reports: Any, shapes: Any) -> Any:
    """``tuner regret --measure``: the unmeasured rows measured on the local device (of kind ``device``)."""
    from tuner import registry
    from tuner.measure.devices.base import DeviceSpec
    from tuner.measure.devices.kinds import resolve
    from tuner.measure.measurer import MeasureOptions, Measurer
    from tuner.service.regret import measure_unmeasured

    if device not in (None, "cuda", "npu", "cpu"):
        raise UserInputError(f"--measure measures on cuda, npu or cpu, not {device!r}")
    spec = resolve(DeviceSpec(device or "auto"))  # type: ignore[arg-type]
    _stop_on_sigterm()
    with Measurer(spec, MeasureOptions(n_samples=samples)) as measurer:
        return measure_unmeasured(reports, shapes, measurer, version=registry.get(template).version)


@app.command()
@boundary
def worker(
    db_url: DbOpt = None,
    device: DeviceOpt = "auto",
    index: Annotated[int, typer.Option(min=0, help="Device index among devices of the kind (one worker per GPU).")] = 0,
    backends: Annotated[str, typer.Option(help="Backends this worker runs, comma-separated.")] = "triton,tilelang",
    heartbeat: Annotated[float, typer.Option(min=0.2, help="Heartbeat interval, seconds.")] = 5.0,
    lease: Annotated[float, typer.Option(
        min=1.0, help="Seconds without heartbeat before the worker is lost (PostgreSQL: above 20 s).")] = 30.0,
    exit_when_idle: Annotated[bool, typer.Option(help="Exit when no task is left instead of waiting.")] = False,
    all_gpus: Annotated[bool, typer.Option(
        "--all-gpus", help="One worker per visible GPU, each pinned to its GPU (CUDA_VISIBLE_DEVICES).")] = False,
    registered_index: Annotated[int | None, typer.Option(
        hidden=True, min=0, help="The index to register (a worker pinned to one GPU by --all-gpus).")] = None,
) -> None:
    """Serve tuning jobs from the store's queue on one device until interrupted (SIGINT/SIGTERM).

    With --all-gpus, start one such worker per GPU this process sees and wait for them."""
    import logging
    import threading

    from tuner.db.retry import StoreHealth, durable
    from tuner.measure.devices.base import DeviceSpec
    from tuner.measure.devices.kinds import resolve
    from tuner.service.worker import Worker, WorkerOptions, parse_backends

    if device not in ("auto", "cuda", "npu", "cpu"):
        raise UserInputError(f"unknown device {device!r}; expected auto, cuda, npu or cpu")
    if lease <= 2 * heartbeat:
        raise UserInputError(f"--lease ({lease:g} s) must exceed twice --heartbeat ({heartbeat:g} s)")
    names = parse_backends(backends)
    if all_gpus and device not in ("auto", "cuda"):
        raise UserInputError("--all-gpus runs CUDA workers: leave --device at auto or cuda")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if all_gpus:
        from tuner.measure.devices.gpus import list_nvidia_gpus, visible_gpus
        from tuner.service.fleet import plan_fleet, run_fleet

        store = durable(lambda: _store(db_url), StoreHealth(), stop)  # migrated once, before the workers start
        args = ["--backends", ",".join(names), "--heartbeat", str(heartbeat), "--lease", str(lease)]
        args += ["--exit-when-idle"] if exit_when_idle else []
        environ = {**os.environ, "TUNER_DB_URL": store.unmasked_url()}  # not on command lines (passwords)
        launches = plan_fleet(visible_gpus(list_nvidia_gpus(), os.environ), args, environ)
        err_console.print(f"starting {len(launches)} worker(s), one per GPU: " + ", ".join(
            f"{launch.gpu.ordinal} ({launch.gpu.physical.uuid})" for launch in launches), highlight=False)
        raise typer.Exit(run_fleet(launches, stop))
    spec = resolve(DeviceSpec(device, index))  # type: ignore[arg-type]
    store = durable(lambda: _store(db_url), StoreHealth(), stop)  # a store down at start is waited for too
    options = WorkerOptions(spec, names, heartbeat, lease, device_index=registered_index)
    served = Worker(store, options).run(stop, exit_when_idle=exit_when_idle)
    err_console.print(f"worker stopped after {served} task(s)")
    # The worker has left the queue: exit now. Tearing down the interpreter (a garbage collection over
    # everything torch and the kernel toolchains loaded) takes seconds, and SIGTERM must end a worker in 5 s.
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(0)


# -- service: server, export, and the API's client commands ------------------------------------------------
UrlOpt = Annotated[str | None, typer.Option("--url", help="Server URL (default: $TUNER_URL or http://127.0.0.1:8000).")]
TokenOpt = Annotated[str | None, typer.Option(
    "--token", help="Bearer token (default: $TUNER_TOKEN, else the local token of `tuner serve`).", show_default=False,
)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the JSON answer.")]


@app.command()
@boundary
def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on (0.0.0.0 for other hosts).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    db_url: DbOpt = None,
    worker: Annotated[bool, typer.Option("--worker/--no-worker", help="Start one local worker too.")] = True,
    workers: Annotated[str, typer.Option(
        "--workers", help="1: one local worker on --device; auto: one per visible GPU, each pinned to it.")] = "1",
    device: DeviceOpt = "auto",
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    access_log: Annotated[bool, typer.Option("--access-log/--no-access-log", help="Log every request.")] = True,
    reverify: Annotated[bool | None, typer.Option(
        "--reverify/--no-reverify", help="Queue a verify job when a best is served from a config verified on "
        "another device name or software (default: on, or $TUNER_REVERIFY_FOREIGN).")] = None,
) -> None:
    """Serve the HTTP API (OpenAPI at /docs) and, unless --no-worker, one worker on --device (--workers auto:
    one per visible GPU, as `tuner worker --all-gpus`)."""
    from tuner.api.main import create_app
    from tuner.api.settings import ApiSettings
    from tuner.service import serve as serving
    from tuner.service.remote import local_token, local_token_path

    if workers not in ("1", "auto"):
        raise UserInputError(f"--workers {workers!r}: expected 1 or auto")
    if workers == "auto" and device not in ("auto", "cuda"):
        raise UserInputError("--workers auto runs one CUDA worker per GPU: leave --device at auto or cuda")
    fleet: tuple[str, tuple[str, ...]] = ("cuda", ("--all-gpus",)) if workers == "auto" else (device, ())
    if device not in ("auto", "cuda", "npu", "cpu"):
        raise UserInputError(f"unknown device {device!r}; expected auto, cuda, npu or cpu")
    try:
        settings = ApiSettings(**({"db_url": db_url} if db_url else {}))  # type: ignore[arg-type]
    except ValueError as exc:  # pydantic's ValidationError or SettingsError; neither names a token (tuner.api.settings)
        errors = getattr(exc, "errors", None)
        text = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors()) if errors else str(exc)
        raise UserInputError(f"invalid TUNER_ settings: {text}") from None
    if reverify is not None:
        settings = settings.model_copy(update={"reverify_foreign": reverify})
    if not settings.tokens:
        token = local_token(create=True)
        settings = settings.model_copy(update={"tokens": {token: frozenset({"submit", "read"})}})
        err_console.print(f"no TUNER_TOKENS set: submitting needs the local token in {local_token_path()}")
    store = _store(settings.db_url)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    err_console.print(f"store {store.url}; API on http://{host}:{port} (docs at /docs)", soft_wrap=True)
    err_console.print(f"exploration pages: http://{shown}:{port}/", highlight=False)
    serving.serve(
        create_app(settings, store), host=host, port=port, log_level=log_level, access_log=access_log,
        worker=(lambda: serving.start_worker(store, *fleet)) if worker else None,
    )


@app.command()
@boundary
def export(
    output: Annotated[Path, typer.Option("--output", "-o", help="The JSON file to write.")],
    template: Annotated[list[str], typer.Option("--template", "-t", help="Only this template (repeatable).")] = [],  # noqa: B006
    device: Annotated[str | None, typer.Option(help="Only this device kind (cuda, npu, cpu).")] = None,
    db_url: DbOpt = None,
) -> None:
    """Write the best configs (with each template's default and constraints) for offline clients."""
    from tuner.service.export import build_export, write_export

    if device is not None and device not in ("cuda", "npu", "cpu"):
        raise UserInputError(f"unknown device {device!r}; expected cuda, npu or cpu")
    if template:
        from tuner import registry

        for name in template:
            registry.spec(name).space()  # unknown template or broken space: exit 2 before touching the store
    document = build_export(
        _store(db_url), templates=template or None, device_kind=device,
        warn=lambda message: err_console.print(f"warning: {message}", highlight=False),
    )
    with _writing(output):
        write_export(document, output)
    n_entries, n_templates = len(document["entries"]), len(document["templates"])
    err_console.print(f"wrote {output}: {n_entries} best config(s) of {n_templates} template(s)")


@app.command()
@boundary
def submit(
    template: TemplateArg,
    workload: WorkloadOpt = [],  # noqa: B006
    shape: ShapeOpt = [],  # noqa: B006
    trials: Annotated[int | None, typer.Option("--trials", "-n", help="Measured trials per shape (default 40; "
                                                "not with --verify).")] = None,
    device: Annotated[str, typer.Option(help="Device kind the job needs: cuda | npu | cpu")] = "cuda",
    device_name: Annotated[str | None, typer.Option(help='Device name, e.g. "NVIDIA H200" (default: any).')] = None,
    sampler: Annotated[str, typer.Option(help="tpe | random | grid | cmaes")] = "tpe",
    samples: Annotated[int, typer.Option(help="Timed samples per candidate.")] = 100,
    timeout: Annotated[float, typer.Option(help="Seconds per candidate before TIMEOUT.")] = 120.0,
    finalists: Annotated[int, typer.Option(help="Configs re-measured in the final round.")] = 3,
    comparators: Annotated[bool, typer.Option(help="Measure the template's comparators.")] = True,
    seed: Annotated[int | None, typer.Option(help="Sampler seed.")] = None,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    verify: Annotated[bool, typer.Option(
        "--verify", help="A verify job: re-measure each shape's published best in fresh processes.")] = False,
    processes: Annotated[int, typer.Option(help="--verify: fresh processes per shape.")] = 5,
    comparator_processes: Annotated[int | None, typer.Option(
        help="--verify: re-measure the comparators in only the first N processes (default: all).")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a tuning job (or, with --verify, a verify job) to a tuner server (validated there; workers with
    a matching device run it)."""
    from tuner.service.remote import call
    from tuner.shapes import parse_shape_text
    from tuner.store.records import check_job_kind

    body: dict[str, Any] = {
        "template": template, "workloads": workload, "shapes": [parse_shape_text(s) for s in shape],
        "device": {"kind": device, "name": device_name}, "samples": samples, "candidate_timeout_s": timeout,
        "comparators": comparators, "priority": priority,
    }
    if verify and trials is not None:  # it was ignored: a verify job re-measures, in --processes fresh processes
        raise UserInputError("--trials is for tuning jobs; a verify job re-measures each shape's published best in "
                             "--processes fresh processes")
    trials = 40 if trials is None else trials
    if verify:
        body.update(kind="verify", processes=processes)
    else:
        body.update(trials=trials, sampler=sampler, finalists=finalists, seed=seed)
    if comparator_processes is not None and (comparators or not verify):  # no comparators: it limits nothing
        try:  # the server's own rule for it, asked here so that a wrong combination fails before any request
            check_job_kind("verify" if verify else "tune", 0 if verify else max(trials, 1),
                           processes if verify else None, comparator_processes)
        except ValueError as exc:
            raise UserInputError(f"{exc} (--comparator-processes goes with --verify, at most --processes)") from None
        body.update(comparator_processes=comparator_processes)
    # one key per submission: a request whose answer is lost is sent again and finds its job, not a second one
    job = call("POST", "/v1/jobs", url=url, token=token, json=body, idempotency_key=uuid.uuid4().hex)
    if as_json:
        print(json.dumps(job, indent=2))
        return
    where = device + (f" ({device_name})" if device_name else "")
    work = f"{job['processes']} fresh processes" if verify else f"{job['trials']} trials"
    if verify and job.get("comparator_processes") is not None:
        work += f" (comparators in the first {job['comparator_processes']})"
    kind = "verify " if verify else ""
    console.print(f"job {job['id']} {job['state']}: {kind}{job['template']}, {len(job['tasks'])} shape(s) × "
                  f"{work} on {where}", highlight=False)
    if job.get("waiting"):  # e.g. no live worker of the device asked for: it waits until one starts
        err_console.print(_waiting_line(job), highlight=False)


@app.command()
@boundary
def jobs(
    state: Annotated[str | None, typer.Option(help="queued | running | done | failed | cancelled")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 20,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the server's jobs, newest first."""
    from tuner.service.remote import call

    params: dict[str, Any] = {"limit": limit, **({"state": state} if state else {})}
    page = call("GET", "/v1/jobs", url=url, token=token, params=params)
    if as_json:
        print(json.dumps(page, indent=2))
        return
    table = Table("id", "state", "kind", "template", "device", "shapes", "trials", "created",
                  title=f"{len(page['items'])} of {page['total']} job(s)", title_justify="left")
    table.columns[3].overflow = "fold"  # a template's name wrapped, never cut (two differ only at their ends)
    for j in page["items"]:
        dev = j["device"]["kind"] + (f" ({j['device']['name']})" if j["device"]["name"] else "")
        progress = j["progress"]
        verify = j.get("kind") == "verify"  # a verify job has no trials: its shapes are re-measured in processes
        work = f"{j['processes']} processes" if verify else f"{progress['trials_done']}/{progress['trials_total']}"
        table.add_row(str(j["id"]), j["state"], j.get("kind", "tune"), j["template"], dev, str(len(j["tasks"])), work,
                      j["created_at"][:19])
    console.print(table)


@app.command()
@boundary
def status(
    job_id: Annotated[int, typer.Argument(help="Job id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One job: state, progress and best so far per shape, workers on it."""
    from tuner.service.remote import call

    _print_job(call("GET", f"/v1/jobs/{job_id}", url=url, token=token), as_json)


@app.command()
@boundary
def cancel(
    job_id: Annotated[int, typer.Argument(help="Job id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a queued or running job (workers stop at their next trial)."""
    from tuner.service.remote import call

    _print_job(call("POST", f"/v1/jobs/{job_id}/cancel", url=url, token=token), as_json)


def _print_job(job: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(job, indent=2))
        return
    progress = job["progress"]
    verify = job.get("kind") == "verify"
    if verify:  # no trials: each shape's published best is re-measured in fresh processes (`tuner verify`)
        done = sum(1 for t in job["tasks"] if t["state"] == "done")
        work = f"{done}/{len(job['tasks'])} shape(s) re-measured in {job['processes']} fresh processes each"
    else:
        work = f"{progress['trials_done']}/{progress['trials_total']} trials"
    console.print(f"job {job['id']} {job['state']}: {'verify ' if verify else ''}{job['template']}@"
                  f"{job['template_version']} on {job['device']['kind']}, {work}"
                  + (f"; workers: {', '.join(job['workers'])}" if job["workers"] else "")
                  + (f"; error: {job['error']}" if job["error"] else ""), highlight=False)
    if job.get("waiting"):
        console.print(_waiting_line(job), highlight=False)
    if verify:  # its figure is the median over the processes; the drift is in `GET /v1/best` and `tuner report`
        table = Table("shape", "state", "gave up", "re-measured µs", "published config")
    else:
        table = Table("shape", "state", "trials", "failed", "gave up", "best µs", "best config")
    for t in job["tasks"]:
        trials = [] if verify else [f"{t['trials_done']}/{t['trials_total']}", str(t["trials_failed"])]
        table.add_row(t["label"], t["state"], *trials, f"{t.get('attempts', 0)}/{job.get('max_attempts', 3)}",
                      "" if t["best_us"] is None else f"{t['best_us']:.2f}",
                      json.dumps(t["best_config"]) if t["best_config"] else "")
    console.print(table)
    for t in job["tasks"]:
        for a in t.get("attempt_reasons", []):
            console.print(f"{t['label']}: given up by {a['worker_id']}: {a['reason']}", highlight=False)


