"""What ``tuner history`` and ``tuner studies`` read from the store and how they print it: rich tables on a
terminal, the same tables with nothing cut when stdout is a file or a pipe, JSON (``--json``) or CSV
(``--csv``) with one record per measurement and full configs. Pure functions of the store's records; the
Typer commands (:mod:`tuner.cli.app`) validate options and call these."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from tuner import db
from tuner.db.explore import SORTS, StudySummary
from tuner.errors import UserInputError
from tuner.frozen import Shape
from tuner.results import Status, reason_line

ROLES = ("trial", "final")
FIELDS = ("study_id", "study", "id", "role", "trial", "candidate", "status", "median_us", "p20_us", "p80_us",
          "n_samples", "timer", "config", "reason", "worker", "created_at")


@dataclass(frozen=True)
class HistorySection:
    """The measurements of one study listed by ``tuner history`` (``total``: how many match without --limit)."""

    label: str
    study: db.StudyRecord
    measurements: tuple[db.MeasurementRecord, ...]
    total: int


def check_filters(role: str | None, statuses: Sequence[str], sort: str) -> list[str]:
    """The statuses, upper-cased; UserInputError (one line) for an unknown role, status or sort."""
    if role is not None and role not in ROLES:
        raise UserInputError(f"unknown --role {role!r}; expected trial or final")
    names = [s.strip().upper() for raw in statuses for s in raw.split(",") if s.strip()]
    known = [s.value for s in Status]
    for name in names:
        if name not in known:
            raise UserInputError(f"unknown --status {name!r}; known: {', '.join(known)}")
    if sort not in SORTS:
        raise UserInputError(f"unknown --sort {sort!r}; known: {', '.join(SORTS)}")
    return names


def history(store: db.Store, template: str, shapes: Sequence[tuple[str, Shape]], *, device: str | None,
            role: str | None, statuses: Sequence[str], sort: str, limit: int | None) -> list[HistorySection]:
    """Every study of these shapes (of any version, fingerprint and device of the kind), oldest first, with its
    measurements filtered and sorted; UserInputError when none of the shapes has a study."""
    wanted = {shape.key(): label for label, shape in shapes}
    sections = []
    for st in store.list_studies(template=template, device_kind=device):
        if st.shape_key not in wanted:
            continue
        page = store.page_measurements(study_id=st.id, role=role, statuses=statuses, sort=sort,
                                       limit=limit if limit is not None else 1 << 62)
        sections.append(HistorySection(wanted[st.shape_key], st, page.items, page.total))
    if not sections:
        keys = ", ".join(wanted)
        raise UserInputError(f"no study stored for {template} at {keys}" + (f" on {device}" if device else ""))
    return sections


def record(section: HistorySection, m: db.MeasurementRecord) -> dict[str, Any]:
    return {
        "study_id": section.study.id, "study": section.study.name, "id": m.id, "role": m.role,
        "trial": m.trial_number, "candidate": m.candidate, "status": m.status.value, "median_us": m.median_us,
        "p20_us": m.p20_us, "p80_us": m.p80_us, "n_samples": m.n_samples, "timer": m.timer, "config": m.config,
        "reason": m.reason, "worker": m.worker, "created_at": m.created_at.isoformat(),
    }


def history_json(sections: Sequence[HistorySection]) -> str:
    return json.dumps([{
        "study": {"id": s.study.id, "name": s.study.name, "label": s.label, "template": s.study.template,
                  "template_version": s.study.template_version, "shape": s.study.shape,
                  "device": f"{s.study.device_kind}:{s.study.device_name}", "fingerprint": s.study.fingerprint_hash},
        "total": s.total,
        "measurements": [record(s, m) for m in s.measurements],
    } for s in sections], indent=2)


def history_csv(sections: Sequence[HistorySection]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    for s in sections:
        for m in s.measurements:
            row = record(s, m)
            row["config"] = json.dumps(row["config"], separators=(",", ":"))
            writer.writerow(row)
    return out.getvalue()


def history_tables(sections: Sequence[HistorySection]) -> list[Table]:
    tables = []
    for s in sections:
        shown = f"{len(s.measurements)} of {s.total}" if len(s.measurements) < s.total else str(s.total)
        table = Table("id", "role", "trial", "candidate", "config", "status", "median µs", "p20–p80", "reason",
                      title=f"{s.label} · {s.study.template} v{s.study.template_version} · {s.study.device_name} "
                            f"(study {s.study.id}) — {shown} measurements", title_justify="left")
        table.columns[4].overflow = "fold"  # a config is read whole or not at all
        for m in s.measurements:
            spread = f"{m.p20_us:.2f}–{m.p80_us:.2f}" if m.p20_us is not None and m.p80_us is not None else ""
            table.add_row(
                str(m.id), m.role, "" if m.trial_number is None else str(m.trial_number), m.candidate,
                json.dumps(m.config, separators=(",", ":")), m.status.value,
                "" if m.median_us is None else f"{m.median_us:.2f}", spread,
                reason_line(m.reason),
            )
        tables.append(table)
    return tables


def studies(store: db.Store, *, template: str | None, device: str | None, limit: int) -> list[StudySummary]:
    return store.list_study_summaries(template=template, device_kind=device, limit=limit)[0]


def study_dict(s: StudySummary, label: str) -> dict[str, Any]:
    best = s.best
    return {
        "id": s.study.id, "label": label, "name": s.study.name, "template": s.study.template,
        "template_version": s.study.template_version, "shape": s.study.shape,
        "device": f"{s.study.device_kind}:{s.study.device_name}", "fingerprint": s.study.fingerprint_hash,
        "trials": s.trials, "failed": s.failed, "invalid": s.invalid,
        "best_us": best.median_us if best else None, "best_config": best.config if best else None,
        "fastest_trial_us": s.fastest_trial_us, "last_activity": s.last_activity.isoformat(),
    }


def studies_table(rows: Sequence[tuple[StudySummary, str]]) -> Table:
    table = Table("id", "template", "version", "shape", "device", "trials (failed)", "invalid", "best µs",
                  "last activity", title=f"{len(rows)} studies, newest first", title_justify="left")
    for s, label in rows:
        table.add_row(
            str(s.study.id), s.study.template, s.study.template_version, label,
            f"{s.study.device_kind}:{s.study.device_name}", f"{s.trials} ({s.failed})", str(s.invalid),
            "–" if s.best is None else f"{s.best.median_us:.2f}", s.last_activity.strftime("%Y-%m-%d %H:%M UTC"),
        )
    return table
