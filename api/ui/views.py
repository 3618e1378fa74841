"""What each page shows, gathered from the store and the catalog: one function per page, returning the
template context (plain values, records and figure dicts). No HTTP here: :mod:`api.ui.pages` routes and
renders; these raise :class:`tuner.errors.NotFoundError` for an unknown id or template.

Each function runs a fixed number of the store's reads (the template page: a few per
study), so that pages stay within their render budget on stores of many studies (benchmarks/ui_render.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from tuner import db
from tuner.api import explore
from tuner.api.best_service import BestRequest, BestService
from tuner.api.catalog import Catalog
from tuner.api.schemas import JobOut
from tuner.api.ui import plots
from tuner.errors import NotFoundError, TunerError, UnknownTemplateError

if TYPE_CHECKING:
    from tuner.report.markdown import ReportRow

log = logging.getLogger(__name__)
ACTIVE = ("queued", "running")


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
    """Templates with their studies per device, the studies most recently active, jobs, workers."""
    now = datetime.now(timezone.utc)
    totals = store.device_totals()
    recent, n_studies = store.list_study_summaries(limit=12)
    jobs = [JobOut.of(j) for state in ACTIVE for j in store.list_jobs(state=state, limit=50)]
    finished = [JobOut.of(j) for j in store.list_jobs(limit=8) if j.state not in ACTIVE]
    workers = store.list_workers()
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


def _latest_per_key(summaries: Sequence[Any]) -> dict[tuple[str, str, str], Any]:
    latest: dict[tuple[str, str, str], Any] = {}
    for s in summaries:
        k = (s.study.shape_key, s.study.device_kind, s.study.device_name)
        if k not in latest or s.study.id > latest[k].study.id:
            latest[k] = s
    return latest


@dataclass(frozen=True)
class ShapeRow:
    """A row of the template page: the report's row, its study, the best config's changes from the default,
    the ``match`` that ``GET /v1/best`` gives for its shape, and each comparator line's time."""

    row: ReportRow
    study: db.StudyRecord | None
    changed: dict[str, Any]
    match: str
    lines: dict[str, float | None]


def template_page(store: db.Store, catalog: Catalog, best: BestService, name: str,
                  device_name: str | None) -> dict[str, Any]:
    """One row per (shape, device) study of the template's newest measurement (the report's figures), a plot
    of best against every line, what ``GET /v1/best`` answers per row, and every study of the template."""
    from tuner.report.markdown import collect

    try:
        entry = catalog.get(name)
    except UnknownTemplateError as exc:
        raise NotFoundError(str(exc)) from None
    summaries, _ = store.list_study_summaries(template=name)
    devices = sorted({s.study.device_name for s in summaries})
    if device_name is not None and device_name not in devices:
        raise NotFoundError(f"no study of {name} on {device_name!r}; devices: {', '.join(devices) or 'none'}")
    device = device_name or (devices[0] if devices else None)
    report = collect(store, name)
    latest = _latest_per_key(summaries)
    rows = []
    for r in report.rows:
        kind, _, dev = r.device.partition(":")
        if dev != device:
            continue
        summary = latest.get((r.shape.key(), kind, dev))
        rows.append(ShapeRow(
            row=r, study=summary.study if summary else None,
            changed={k: v for k, v in (r.best_config or {}).items() if entry.space.default.get(k) != v},
            match=_match(best, name, r.shape.to_dict(), kind, dev),
            lines={ln.name: ln.median_us for ln in r.lines},
        ))
    line_names = sorted({n for row in rows for n, us in row.lines.items() if us is not None})
    figure = plots.lines_figure([{"workload": row.row.workload, "best_us": row.row.best_us,
                                  "default_us": row.row.default_us, "lines": row.lines} for row in rows])
    return {
        "info": template_info(catalog, name), "entry": entry, "devices": devices, "device": device,
        "rows": rows, "line_names": line_names, "figure": figure,
        "studies": [explore.brief(catalog, s) for s in summaries if s.study.device_name == device],
    }


def _match(best: BestService, template: str, shape: dict[str, Any], kind: str, device_name: str) -> str:
    try:
        return best.answer(BestRequest(template, shape, kind, device_name)).match
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
    best = explore.round_best(final)
    config = summary.best.config if summary.best else None
    return {
        "s": detail, "trials": trials, "n_trials": len(trials),
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


def job_page(store: db.Store, catalog: Catalog, job_id: int) -> dict[str, Any]:
    now = datetime.now(timezone.utc)
    record = store.get_job(job_id=job_id)
    if record is None:
        raise NotFoundError(f"no job {job_id}")
    workers = [w for w in store.list_workers(include_stopped=True) if w.id in record.workers]
    return {"job": JobOut.of(record), "info": template_info(catalog, record.template),
            "workers": [(w, (now - w.last_heartbeat).total_seconds()) for w in workers]}


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
