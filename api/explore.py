"""What the exploration pages and ``/v1/studies`` show, built from the store's records: readable study names,
study summaries, a study's detail (final round, failures), and the ratios between candidates.

Pure functions of records and the template catalog (no HTTP, no Optuna); the JSON routes return these
models and the pages render them, so both always agree.
"""

from __future__ import annotations

import json
import math

from tuner import db
from tuner.api.catalog import Catalog
from tuner.api.schemas import MeasurementOut
from tuner.api.study_schemas import FailureOut, FinalOut, StudyBrief, StudyDetail
from tuner.db.explore import StudySummary
from tuner.errors import TunerError
from tuner.frozen import Config, Shape
from tuner.results import DEFAULT_LABEL
from tuner.store.entries import disproved_in, round_winner


def workload_of(catalog: Catalog, template: str, shape_json: str) -> str | None:
    """The name of the template's workload with this shape, or None (no such workload, or a template this
    server does not know: stores may hold studies of templates registered elsewhere)."""
    try:
        return catalog.get(template).spec.workload_name(Shape.from_json(shape_json))
    except (TunerError, ImportError, AttributeError, TypeError, ValueError):
        return None


def study_label(study: db.StudyRecord, workload: str | None) -> str:
    """``<workload or shape> · <template> v<version> · <device>`` instead of the 130-character key."""
    return f"{workload or study.shape_key} · {study.template} v{study.template_version} · {study.device_name}"


def brief(catalog: Catalog, summary: StudySummary) -> StudyBrief:
    s, best = summary.study, summary.best
    workload = workload_of(catalog, s.template, s.shape_json)
    return StudyBrief(
        id=s.id, label=study_label(s, workload), name=s.name, template=s.template, template_version=s.template_version,
        workload=workload, shape=s.shape, shape_key=s.shape_key, device_kind=s.device_kind, device_name=s.device_name,
        fingerprint=s.fingerprint_hash, created_at=s.created_at, last_activity=summary.last_activity,
        trials=summary.trials, failed=summary.failed, invalid=summary.invalid, statuses=dict(summary.statuses),
        best_us=best.median_us if best else None, best_p20_us=best.p20_us if best else None,
        best_p80_us=best.p80_us if best else None, best_config=best.config if best else None,
        fastest_trial_us=summary.fastest_trial_us, page=f"/ui/studies/{s.id}",
    )


def detail(store: db.Store, catalog: Catalog, summary: StudySummary) -> StudyDetail:
    """The study's brief with its fingerprint, latest final round (fastest first) and failure groups."""
    final = store.latest_round(study_id=summary.study.id)
    failures = store.failure_groups(study_id=summary.study.id)
    best = round_winner(final, disproved_in(store, summary.study.id),
                        Config(summary.best.config) if summary.best else None)
    default = next((m for m in final if m.candidate == DEFAULT_LABEL and m.ok), None)
    best_us = best.median_us if best else None
    ordered = sorted(final, key=lambda m: (m.median_us is None, m.median_us or 0.0, m.id))
    return StudyDetail(
        **brief(catalog, summary).model_dump(),
        fingerprint_info=_fingerprint(summary.study.fingerprint_json),
        best_measurement_id=summary.best.measurement_id if summary.best else None,
        default_us=default.median_us if default else (best_us if best and best.candidate == DEFAULT_LABEL else None),
        timer=best.timer if best else next((m.timer for m in final if m.timer), None),
        final_round=[final_out(m, best_us) for m in ordered],
        failures=[FailureOut(status=f.status, reason=f.reason, count=f.count) for f in failures],
    )


def final_out(m: db.MeasurementRecord, best_us: float | None) -> FinalOut:
    ratio = m.median_us / best_us if m.median_us is not None and best_us else None
    errors = {name: (None if math.isnan(v) or math.isinf(v) else v) for name, v in m.errors.items()}
    return FinalOut(**MeasurementOut.of(m).model_dump(), errors=errors, ratio=ratio)


def _fingerprint(text: str) -> dict[str, object]:
    data = json.loads(text)
    return dict(data) if isinstance(data, dict) else {}
