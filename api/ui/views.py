"""What each page shows, gathered from the store and the catalog: one function per page, returning the
template context (plain values, records and figure dicts). No HTTP here: :mod:`api.ui.pages` routes and
renders; these raise :class:`tuner.errors.NotFoundError` for an unknown id or template.

Each function runs a fixed number of the store's reads (the template page reads all its rows' studies in
batches; the compare page a few per study it compares), so that pages stay within their render budget on
stores of many studies (benchmarks/ui_render.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from tuner import db
from tuner.api import explore
from tuner.api.best_service import BestRequest, BestService
from tuner.api.catalog import Catalog, CatalogEntry
from tuner.api.errors import FieldError
from tuner.api.jobs_view import job_out, task_attempts
from tuner.api.schemas import BestOut, JobOut
from tuner.api.ui import plots
from tuner.db.explore import StudyOutcome
from tuner.dims import Dim
from tuner.errors import NotFoundError, ShapeError, TunerError, UnknownTemplateError
from tuner.frozen import Config, Shape, scalar_text
from tuner.keys import KINDS
from tuner.results import COMPARATOR_PREFIX, DEFAULT_LABEL, Status
from tuner.shapes import parse_shape_text
from tuner.store.entries import disproved_by_study, disproved_in, round_winner
from tuner.store.records import (
    ACTIVE_JOB_STATES,
    OPEN_TASK_STATES,
    TaskAttemptRecord,
    VerificationRecord,
    advertises,
    claimable_tasks,
    current_studies,
    is_live,
    serves,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TemplateInfo:
    name: str
    version: str
    backend: str
    operator: str
    doc: str
    loaded: bool  # False: the template does not load in this server (its error is in ``doc``)


def template_info(catalog: Catalog, name: str) -> TemplateInfo:
    try:
        t = catalog.get(name).spec
    except (TunerError, ImportError, AttributeError, TypeError) as exc:
        return TemplateInfo(name, "?", "?", "?", f"does not load here: {exc}", False)
    module = t.implementation.partition(":")[0].split(".")  # kernels.<operator>.<module>:Class
    operator = module[module.index("kernels") + 1] if "kernels" in module[:-1] else module[-1]
    return TemplateInfo(name, t.version, t.backend, operator, (t.doc or "").strip().split("\n\n")[0], True)


def overview(store: db.Store, catalog: Catalog) -> dict[str, Any]:
    """Templates with their studies per device, the studies most recently active, jobs (an active one with
    why it waits, when it does), workers."""
    now = store.clock()  # leases and heartbeats are the store's clock's
    totals = store.device_totals()
    recent, n_studies = store.list_study_summaries(limit=12, by_activity=True)
    active = [j for state in ACTIVE_JOB_STATES for j in store.list_jobs(state=state, limit=50)]
    finished = [JobOut.of(j) for j in store.list_jobs(limit=8) if j.state not in ACTIVE_JOB_STATES]
    workers = store.list_workers()
    # Each active job with why it waits, as GET /v1/jobs says it (one read of attempts for all of them).
    attempts = task_attempts(store, active)
    jobs = [job_out(store, j, workers, attempts, {}, now) for j in active]
    names = sorted(set(catalog.names()) | {t.template for t in totals})
    return {
        "templates": [template_info(catalog, n) for n in names],
        "totals": totals,
        "recent": [explore.brief(catalog, s) for s in sorted(recent, key=lambda s: s.last_activity, reverse=True)],
        "n_studies": n_studies,
        "jobs": sorted(jobs, key=lambda j: j.id, reverse=True),
        "finished": finished,
        "workers": [(w, (now - w.last_heartbeat).total_seconds(), w.lease_expires_at < now) for w in workers],
    }


@dataclass(frozen=True)
class ShapeRow:
    """A row of the template page, from its study's latest final round: the best entry (fastest OK
    non-comparator) with its p20-p80, the default, each comparator's time, the study's trials (failed) and
    search time, its changes from the default, and the ``match`` that ``GET /v1/best`` gives for its shape.

    Each comparator is a line of its own: grouping comparators into one line needs the implementation
    (:attr:`tuner.template.Comparator.group`), which the API does not import. No roofline, for the same
    reason (bytes moved is the implementation's)."""

    workload: str
    version: str
    study: db.StudyRecord
    best_config: dict[str, Any] | None
    best_us: float | None
    best_spread: tuple[float, float] | None
    default_us: float | None
    lines: dict[str, float | None]
    trials: int
    failed: int
    search_s: float | None
    changed: dict[str, Any]
    match: str
    verification: VerificationRecord | None = None  # the latest `tuner verify` of the row's study, as the report's


def _shape_row(entry: CatalogEntry, study: db.StudyRecord, outcome: StudyOutcome | None, match: str,
               disproved: set[Config], published: Config | None) -> ShapeRow:
    final = outcome.final if outcome else ()
    ok = [e for e in final if e.status == Status.OK.value and e.median_us is not None]
    best = round_winner(final, disproved, published)
    default = best if best is not None and best.candidate == DEFAULT_LABEL else next(
        (e for e in ok if e.candidate == DEFAULT_LABEL), None)
    lines: dict[str, float | None] = {}
    for e in final:
        if e.candidate.startswith(COMPARATOR_PREFIX):
            name = e.candidate[len(COMPARATOR_PREFIX):]
            us = e.median_us if e.status == Status.OK.value else None
            lines[name] = us if lines.get(name) is None else min(lines[name] or math.inf, us or math.inf)
    config = json.loads(best.config_json) if best else None
    try:
        workload = entry.spec.workload_name(Shape.from_json(study.shape_json)) or study.shape_key
    except (TypeError, ValueError):
        workload = study.shape_key
    return ShapeRow(
        workload=workload, version=study.template_version, study=study, best_config=config,
        best_us=best.median_us if best else None,
        best_spread=(best.p20_us, best.p80_us) if best and best.p20_us is not None and best.p80_us is not None
        else None,
        default_us=default.median_us if default else None, lines=lines,
        trials=outcome.trials if outcome else 0, failed=outcome.failed if outcome else 0,
        search_s=outcome.search_s if outcome else None,
        changed={k: v for k, v in (config or {}).items() if entry.space.default.get(k) != v}, match=match,
    )


def template_page(store: db.Store, catalog: Catalog, best: BestService, name: str,
                  device_name: str | None, ask: Mapping[str, str] | None = None,
                  ask_kind: str | None = None) -> dict[str, Any]:
    """One row per (shape, device) of the template: the latest final round of the study that shows the shape
    (:func:`tuner.store.records.current_studies`, as ``tuner report`` picks it; one aggregate read for all
    rows, :meth:`db.Store.study_outcomes`), a plot of best against every line, what ``GET /v1/best`` answers
    per row, every study of the template, and the form that asks the lookup for any shape (:func:`ask_lookup`;
    ``ask``: the dims the form sent, None when it was not sent; ``ask_kind``: its device kind)."""
    try:
        entry = catalog.get(name)
    except UnknownTemplateError as exc:
        raise NotFoundError(str(exc)) from None
    summaries, _ = store.list_study_summaries(template=name)
    devices = sorted({s.study.device_name for s in summaries})
    if device_name is not None and device_name not in devices:
        raise NotFoundError(f"no study of {name} on {device_name!r}; devices: {', '.join(devices) or 'none'}")
    device = device_name or (devices[0] if devices else None)
    bests = store.list_best(template=name)
    shown = current_studies([s.study for s in summaries], bests)
    published = {b.study_id: Config.from_json(b.config_json) for b in bests}
    # shapes in numeric order of their dims (H=8 before H=16), not as text
    latest = sorted((st for k, st in shown.items() if k[2] == device), key=lambda st: plots.natural_key(st.shape_key))
    outcomes = store.study_outcomes(study_ids=[st.id for st in latest])
    checks = store.latest_verifications(study_ids=[st.id for st in latest])
    disproved = disproved_by_study(store, [st.id for st in latest])
    rows = [_shape_row(entry, st, outcomes.get(st.id),
                       _match(best, name, json.loads(st.shape_json), st.device_kind, st.device_name),
                       disproved[st.id], published.get(st.id))
            for st in latest]
    # only a verification of the config the row shows as best (a later sweep may have published another)
    rows = [dataclasses.replace(row, verification=check.of_config(row.best_config))
            if (check := checks.get(row.study.id)) is not None else row for row in rows]
    line_names = sorted({n for row in rows for n, us in row.lines.items() if us is not None}, key=plots.natural_key)
    figure = plots.lines_figure([{"workload": row.workload, "best_us": row.best_us,
                                  "default_us": row.default_us, "lines": row.lines} for row in rows])
    page_kind = next((st.device_kind for st in latest), None)
    kind = ask_kind or page_kind or KINDS[0]
    example = json.loads(latest[0].shape_json) if latest else None
    # the page's device name goes with its own kind only: a name of another kind's device matches nothing
    ask_name = device if kind == page_kind else None
    return {
        "info": template_info(catalog, name), "entry": entry, "devices": devices, "device": device,
        "rows": rows, "line_names": line_names, "figure": figure,
        "studies": [explore.brief(catalog, s) for s in summaries if s.study.device_name == device],
        "ask": ask_lookup(best, entry, kind, ask_name, ask, example),
    }


@dataclass(frozen=True)
class AskField:
    """One dim of the template page's lookup form: its name, kind (int, bool, str), the value shown (blank:
    left to the dim's default), the dim's default as the form spells it (None: the dim is required), the
    options of a select (bool and choice dims: the default first as a blank option, then each value; a value
    sent that is none of them is kept, marked invalid) and the dim's doc."""

    name: str
    kind: str
    value: str
    default: str | None
    options: tuple[tuple[str, str], ...] | None  # (value, label); None: a text field
    invalid: bool
    doc: str


@dataclass(frozen=True)
class Ask:
    """The lookup form of the template page and, once sent, what ``GET /v1/best`` answers for its shape on the
    page's device (``answer``, the same :class:`BestOut` as the API's, apart from the API's answer cache, which
    may serve an answer up to twice its TTL old, or a stale one while the store is down; ``changed``: its
    config's changes from the search space's default) or why it cannot (``error``: the API's 422 message for
    the shape). ``api_url``: the same question as an API call. Immutable."""

    fields: tuple[AskField, ...]
    device_kind: str
    device_name: str | None
    kinds: tuple[str, ...] = KINDS
    asked: bool = False
    answer: BestOut | None = None
    changed: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None
    api_url: str | None = None
    source: str | None = None  # the shape the served config was measured for, as the form spells dims


def ask_lookup(best: BestService, entry: CatalogEntry, device_kind: str, device_name: str | None,
               raw: Mapping[str, str] | None, example: Mapping[str, Any] | None) -> Ask:
    """The form's fields (the values sent, else ``example``'s, else the template's first workload's) and, when
    ``raw`` was sent, the answer of the server's own lookup (:meth:`BestService.answer`, nothing queued for
    re-verification) for the dims given: blank fields are left out (the template fills its defaults, or says
    which dim is missing) and the rest is read as the API reads ``shape=`` (one ``NAME=VALUE,…`` text, so that
    the page and its API link ask the same). A shape the template rejects is an ``error``, not an exception;
    StoreError propagates (the page's 503)."""
    if example is None and entry.spec.workloads:
        example = entry.spec.workloads[0].shape
    shown = dict(raw) if raw is not None else {k: _form_value(v) for k, v in (example or {}).items()}
    fields = tuple(_field(d, shown.get(d.name, "")) for d in entry.spec.dims)
    ask = Ask(fields, device_kind, device_name)
    if raw is None:
        return ask
    shape_text = ",".join(f"{k}={v.strip()}" for k, v in raw.items() if v.strip())
    query = {"template": entry.name, "device": device_kind, "shape": shape_text,
             **({"device_name": device_name} if device_name else {})}
    api_url = "/v1/best?" + urlencode(query)
    try:
        given = parse_shape_text(shape_text) if shape_text else {}
        answer = best.answer(BestRequest(entry.name, given, device_kind, device_name), report_foreign=False)
    except (ShapeError, FieldError) as exc:  # malformed text, or a shape the template rejects: the API's 422
        if isinstance(exc, FieldError) and tuple(exc.loc) != ("query", "shape"):
            raise
        return dataclasses.replace(ask, asked=True, error=str(exc), api_url=api_url)
    default = entry.space.default
    changed = {k: v for k, v in answer.config.items() if default.get(k) != v}
    source = Shape(answer.source_shape).key() if answer.source_shape is not None else None
    return dataclasses.replace(ask, asked=True, answer=answer, changed=changed, api_url=api_url, source=source)


def _field(dim: Dim, sent: str) -> AskField:
    """The form's field for ``dim`` showing ``sent`` (as the dim reads it where it can: ``1`` for a bool shows
    ``true``; a value it refuses is shown as sent, marked invalid)."""
    default = None if dim.default is None else _form_value(dim.default)
    value, invalid = sent.strip(), False
    if value:
        try:
            value = _form_value(dim.coerce(value))
        except ShapeError:
            invalid = True
    options: tuple[tuple[str, str], ...] | None = None
    if dim.kind == "bool" or dim.choices:
        values = list(dim.choices or ("true", "false"))
        options = (((("", f"default ({default})"),) if default is not None else ())
                   + tuple((v, v) for v in values) + (((value, f"{value} (invalid)"),) if invalid else ()))
    return AskField(dim.name, dim.kind, value, default, options, invalid, dim.doc)


def _form_value(value: Any) -> str:
    """A dim's value as the form shows it: as the API spells it (:func:`tuner.frozen.scalar_text`), blank for
    none."""
    return "" if value is None else scalar_text(value)


def _match(best: BestService, template: str, shape: dict[str, Any], kind: str, device_name: str) -> str:
    try:
        return best.answer(BestRequest(template, shape, kind, device_name), report_foreign=False).match
    except TunerError as exc:  # the shape no longer fits the template (older version): say so
        return f"none ({type(exc).__name__})"


def study_page(store: db.Store, catalog: Catalog, study_id: int) -> dict[str, Any]:
    """Everything the study page shows (its trials table is paged through ``/v1/studies/{id}/trials``)."""
    summary = store.get_study_summary(study_id=study_id)
    if summary is None:
        raise NotFoundError(f"no study {study_id}")
    detail = explore.detail(store, catalog, summary)
    trials = store.list_measurements(study_id=study_id, role="trial")
    final = store.latest_round(study_id=study_id)
    names = sorted({k for m in trials for k in json.loads(m.config_json)})
    config = summary.best.config if summary.best else None
    best = round_winner(final, disproved_in(store, study_id), Config(config) if config is not None else None)
    return {
        "s": detail, "trials": trials, "n_trials": len(trials),
        "verification": (check.of_config(config)
                         if (check := store.latest_verifications(study_ids=[study_id]).get(study_id)) else None),
        "trials_figure": plots.trials_figure(trials),
        "param_figures": plots.parameter_figures(trials, names),
        "final_figure": plots.final_figure(final, best.id if best else None) if final else None,
        "final_labels": plots.final_labels(final),
        "best_id": best.id if best else None,
        "config_json": json.dumps(config, indent=2) if config is not None else None,
        "launch_kwargs": ", ".join(f"{k}={v!r}" for k, v in config.items()) if config is not None else None,
        "error_names": sorted({k for f in detail.final_round for k in f.errors}),
        "statuses": [st for st in plots.STATUS_ORDER if st in detail.statuses],
        "colors": plots.STATUS_COLORS,
    }


@dataclass(frozen=True)
class Candidate:
    """A live worker that advertises a job's template at its version, as the job page lists it: whether it
    could claim a task of the job now, or holds one already (:func:`tuner.store.records.claimable_tasks`, the
    queue's claim rule, on the records the page read), and why, in words (``verdict``)."""

    worker: db.WorkerRecord
    heartbeat_s: float
    may_claim: bool
    verdict: str


def _verdict(job: db.JobRecord, worker: db.WorkerRecord, attempts: Sequence[TaskAttemptRecord]) -> tuple[bool, str]:
    """Whether the worker could claim a task of the job, and why (not) in words ("on it": it holds one now;
    "yes, once free": it could, when it has finished the task it holds of another job)."""
    if job.state not in ACTIVE_JOB_STATES:
        return False, "no: the job is finished"
    if not serves(worker, job):
        return False, f"no: the job wants {job.device_kind}:{job.device_name or 'any'} with {job.backend}"
    if worker.id in job.workers:
        return True, "on it"  # it holds a task of this job now (drawn as a yes, not as a refusal)
    open_tasks = [t for t in job.tasks if t.state in OPEN_TASK_STATES]
    takes = claimable_tasks(job, job.tasks, worker, attempts)
    if takes:
        count = f"{len(takes)} of {len(open_tasks)} open shape{'s' if len(open_tasks) != 1 else ''}"
        if worker.current_task_id is not None:  # busy elsewhere (on this job it would be "on it")
            return True, f"yes, once free ({count}; busy on another job)"
        return True, f"yes ({count})"
    if not open_tasks:
        return False, "no: no shape is open (the rest are being finalised)"
    given_up = {a.task_id for a in attempts if a.worker_id == worker.id}
    gave = ", ".join(t.label for t in open_tasks if t.id in given_up)
    full = ", ".join(t.label for t in open_tasks if t.id not in given_up)
    if not full:
        return False, f"no: gave up every open shape ({gave})"
    taken = f"every trial of {full} is taken"  # until a worker gives its slot back (stops, is lost)
    return False, f"no: gave up {gave}; {taken}" if gave else f"no: {taken}"


def job_page(store: db.Store, catalog: Catalog, job_id: int) -> dict[str, Any]:
    """The job as ``GET /v1/jobs/{id}`` serves it (:func:`tuner.api.jobs_view.job_out`: why it waits, each
    task's attempts and their reasons), the workers on it, and the live workers that advertise its template
    at its version (:class:`Candidate`), with the number of live workers. Reads the live workers once
    (stopped ones are not read: a worker on the job is busy, hence listed)."""
    now = store.clock()
    record = store.get_job(job_id=job_id)
    if record is None:
        raise NotFoundError(f"no job {job_id}")
    listed = store.list_workers()
    attempts = task_attempts(store, [record])
    job = job_out(store, record, listed, attempts, now=now)
    every_attempt = [a for of_task in attempts.values() for a in of_task]
    live = [w for w in listed if is_live(w, now)]
    return {
        "job": job, "info": template_info(catalog, record.template),
        "workers": [(w, (now - w.last_heartbeat).total_seconds()) for w in listed if w.id in record.workers],
        "candidates": [Candidate(w, (now - w.last_heartbeat).total_seconds(), *_verdict(record, w, every_attempt))
                       for w in live if advertises(w, record)],
        "n_live": len(live),
    }


def compare_page(store: db.Store, catalog: Catalog, ids: Sequence[int]) -> dict[str, Any]:
    """Studies side by side (their key fields, counts, final rounds) and their trial distributions; with
    fewer than two ids, the list to choose from."""
    everything, _ = store.list_study_summaries()
    chosen = []
    for study_id in ids:
        summary = store.get_study_summary(study_id=study_id)
        if summary is None:
            raise NotFoundError(f"no study {study_id}")
        trials = store.list_measurements(study_id=study_id, role="trial")
        chosen.append((explore.detail(store, catalog, summary), trials))
    fields = ("template", "template_version", "shape_key", "device_kind", "device_name", "fingerprint")
    differs = {f for f in fields if len({getattr(d, f) for d, _ in chosen}) > 1}
    return {
        "all": [explore.brief(catalog, s) for s in everything], "chosen": [d for d, _ in chosen],
        "fields": fields, "differs": differs, "ids": list(ids),
        "figure": plots.ecdf_figure([(f"#{d.id} {d.label}", t) for d, t in chosen]) if len(chosen) >= 2 else None,
    }
