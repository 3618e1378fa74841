"""Read queries of the exploration pages and the ``/v1/studies`` endpoints: studies with their counts, pages of
a study's measurements in any order, and the store's totals per template and device.

Functions take a session from :meth:`db.Store.session` first and keyword arguments after it; they return
frozen records (below and :mod:`db.records`) and never write. Invalid arguments (an unknown sort, role or
status, a negative limit) raise ValueError; a study that does not exist gives None or an empty page.
Each function runs a fixed number of queries whatever the number of studies (no query per row; an IN list
binds at most :data:`~tuner.db._chunks.IN_CHUNK` ids, so a query is sent once per chunk of them), so that a
page stays fast on a store holding many studies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, func, literal, or_, select
from sqlalchemy.orm import Session

from tuner.db._chunks import in_chunks
from tuner.db._convert import as_utc, to_record
from tuner.db.models import BestConfigRow, MeasurementRow, StudyRow
from tuner.store.records import BestRecord, MeasurementRecord, Status, StudyRecord, active_seconds

# Sort keys of :func:`page_measurements`: a leading '-' sorts descending; rows without a value come last.
SORTS = ("id", "-id", "trial_number", "-trial_number", "median_us", "-median_us", "status", "-status",
         "created_at", "-created_at")
_SORT_COLUMNS = {
    "id": MeasurementRow.id,
    "trial_number": MeasurementRow.trial_number,
    "median_us": MeasurementRow.median_us,
    "status": MeasurementRow.status,
    "created_at": MeasurementRow.created_at,
}


@dataclass(frozen=True)
class StudySummary:
    """A study with what its list row shows: trial counts by status, the published best, the fastest trial.

    ``trials`` counts sweep trials that were measured (INVALID configs are rejected before any build and
    counted apart, in ``invalid``); ``failed`` those of them that did not end OK. ``statuses`` gives every
    trial status with its count, most frequent first. ``last_activity`` is the newest measurement's time
    (the study's creation when it has none).
    """

    study: StudyRecord
    trials: int
    failed: int
    invalid: int
    final: int
    statuses: tuple[tuple[str, int], ...]
    best: BestRecord | None
    fastest_trial_us: float | None
    last_activity: datetime


@dataclass(frozen=True)
class MeasurementPage:
    """One page of a study's measurements and how many match the filters in all."""

    items: tuple[MeasurementRecord, ...]
    total: int


@dataclass(frozen=True)
class DeviceTotals:
    """How much of one template the store holds on one device."""

    template: str
    device_kind: str
    device_name: str
    studies: int
    shapes: int
    versions: tuple[str, ...]


def shape_filter(dims: Mapping[str, str]) -> list[Any]:
    """WHERE clauses matching studies whose canonical shape key holds every ``dim=value`` exactly (values
    written as :meth:`tuner.frozen.FrozenMap.key` writes them: ``true``/``false`` for flags): names and values
    compared case-sensitively, as the template writes them, on every database. Not LIKE: SQLite's ignores
    ASCII case (``n=8`` matched ``N=8``) and PostgreSQL's does not; ``replace()`` compares exactly on both,
    and a ``%`` or ``_`` in the text is no wildcard."""
    padded = literal(",") + StudyRow.shape_key + literal(",")
    return [func.replace(padded, literal(f",{name}={value},"), literal("")) != padded for name, value in dims.items()]


def _study_query(
    query: Select[Any], template: str | None, template_version: str | None, device_kind: str | None,
    device_name: str | None, dims: Mapping[str, str],
) -> Select[Any]:
    for column, value in (
        (StudyRow.template, template), (StudyRow.template_version, template_version),
        (StudyRow.device_kind, device_kind), (StudyRow.device_name, device_name),
    ):
        if value is not None:
            query = query.where(column == value)
    clauses = shape_filter(dims)
    return query.where(and_(*clauses)) if clauses else query


def list_study_summaries(
    session: Session,
    *,
    template: str | None = None,
    template_version: str | None = None,
    device_kind: str | None = None,
    device_name: str | None = None,
    dims: Mapping[str, str] | None = None,
    study_ids: Sequence[int] | None = None,
    limit: int | None = None,
    offset: int = 0,
    by_activity: bool = False,
) -> tuple[list[StudySummary], int]:
    """Studies matching the filters (None: any; ``dims``: shape dims that must hold these values; ``study_ids``:
    only these), newest first (``by_activity``: latest measured first, a study without measurements at its
    creation), paged; with how many match in all."""
    if (limit is not None and limit < 0) or offset < 0:
        raise ValueError("limit and offset must not be negative")
    dims = dims or {}
    query = _study_query(select(StudyRow), template, template_version, device_kind, device_name, dims)
    count = _study_query(select(func.count(StudyRow.id)), template, template_version, device_kind, device_name,
                         dims)
    if study_ids is not None:
        query = query.where(StudyRow.id.in_(list(study_ids)))
        count = count.where(StudyRow.id.in_(list(study_ids)))
    total = int(session.scalar(count) or 0)
    if by_activity:  # each study's newest measurement: one probe of (study_id, created_at)'s index per study
        last = (select(func.max(MeasurementRow.created_at)).where(MeasurementRow.study_id == StudyRow.id)
                .correlate(StudyRow).scalar_subquery())
        query = query.order_by(func.coalesce(last, StudyRow.created_at).desc(), StudyRow.id.desc())
    else:
        query = query.order_by(StudyRow.id.desc())
    rows = list(session.scalars(query.offset(offset).limit(limit)))
    studies = [to_record(StudyRecord, row) for row in rows]
    return summarize(session, studies), total


def get_study_summary(session: Session, *, study_id: int) -> StudySummary | None:
    """One study's summary, or None when there is no such study."""
    row = session.get(StudyRow, study_id)
    return None if row is None else summarize(session, [to_record(StudyRecord, row)])[0]


def summarize(session: Session, studies: Sequence[StudyRecord]) -> list[StudySummary]:
    """The summaries of these studies, in their order (two queries per :data:`~tuner.db._chunks.IN_CHUNK`
    studies)."""
    per_study: dict[int, list[tuple[str, str, int, datetime | None, float | None]]] = {}
    bests: dict[int, BestRecord] = {}
    for ids in in_chunks(s.id for s in studies):
        grouped = session.execute(
            select(
                MeasurementRow.study_id, MeasurementRow.role, MeasurementRow.status, func.count(MeasurementRow.id),
                func.max(MeasurementRow.created_at), func.min(MeasurementRow.median_us),
            )
            .where(MeasurementRow.study_id.in_(ids))
            .group_by(MeasurementRow.study_id, MeasurementRow.role, MeasurementRow.status)
        ).all()
        bests.update({row.study_id: to_record(BestRecord, row)
                      for row in session.scalars(select(BestConfigRow).where(BestConfigRow.study_id.in_(ids)))})
        for study_id, role, status, n, newest, fastest in grouped:
            per_study.setdefault(study_id, []).append((role, status, int(n), newest, fastest))
    return [_summary(s, per_study.get(s.id, []), bests.get(s.id)) for s in studies]


def _summary(
    study: StudyRecord, groups: Sequence[tuple[str, str, int, datetime | None, float | None]], best: BestRecord | None,
) -> StudySummary:
    trial_groups = [g for g in groups if g[0] == "trial"]
    statuses = sorted(((status, n) for _, status, n, _, _ in trial_groups), key=lambda item: (-item[1], item[0]))
    invalid = sum(n for status, n in statuses if status == Status.INVALID.value)
    ok = sum(n for status, n in statuses if status == Status.OK.value)
    trials = sum(n for _, n in statuses) - invalid
    stamps = [as_utc(newest) for _, _, _, newest, _ in groups if newest is not None]
    fastest = [f for _, status, _, _, f in trial_groups if status == Status.OK.value and f is not None]
    return StudySummary(
        study=study, trials=trials, failed=trials - ok, invalid=invalid,
        final=sum(n for role, _, n, _, _ in groups if role == "final"), statuses=tuple(statuses), best=best,
        fastest_trial_us=min(fastest) if fastest else None,
        last_activity=max(stamps) if stamps else study.created_at,
    )


def page_measurements(
    session: Session,
    *,
    study_id: int,
    role: str | None = None,
    statuses: Sequence[Status | str] = (),
    sort: str = "id",
    limit: int = 50,
    offset: int = 0,
) -> MeasurementPage:
    """A page of a study's measurements (``statuses``: any of these; empty: all), sorted by one of SORTS.

    Ties are broken by id, so that pages never overlap. Raises ValueError for an unknown sort, role or status.
    """
    if sort.lstrip("-") not in _SORT_COLUMNS or sort.count("-") > 1:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}; got {sort!r}")
    if limit < 0 or offset < 0:
        raise ValueError("limit and offset must not be negative")
    if role is not None and role not in ("trial", "final"):
        raise ValueError(f"role must be trial or final; got {role!r}")
    values = [Status(s).value for s in statuses]
    where = [MeasurementRow.study_id == study_id]
    if role is not None:
        where.append(MeasurementRow.role == role)
    if values:
        where.append(MeasurementRow.status.in_(values))
    column = _SORT_COLUMNS[sort.lstrip("-")]
    direction = column.desc() if sort.startswith("-") else column.asc()
    query = (
        select(*MeasurementRow.__table__.columns).where(*where)
        .order_by(column.is_(None), direction, MeasurementRow.id)
        .offset(offset).limit(limit)
    )
    total = int(session.scalar(select(func.count(MeasurementRow.id)).where(*where)) or 0)
    return MeasurementPage(tuple(to_record(MeasurementRecord, row) for row in session.execute(query)), total)


def device_totals(session: Session) -> list[DeviceTotals]:
    """Studies and distinct shapes per (template, device), with the template versions measured."""
    rows = session.execute(
        select(StudyRow.template, StudyRow.device_kind, StudyRow.device_name, StudyRow.template_version,
               StudyRow.shape_key)
    ).all()
    grouped: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
    for template, kind, name, version, shape_key in rows:
        grouped.setdefault((template, kind, name), []).append((version, shape_key))
    return [
        DeviceTotals(template, kind, name, len(items), len({shape for _, shape in items}),
                     tuple(sorted({version for version, _ in items}, key=_version_order)))
        for (template, kind, name), items in sorted(grouped.items())
    ]


def _version_order(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (1 << 30, version)


@dataclass(frozen=True)
class FailureGroup:
    """Sweep trials of one non-OK status that failed for one reason (its first line), and how many."""

    status: str
    reason: str
    count: int


def failure_groups(session: Session, *, study_id: int, role: str = "trial") -> list[FailureGroup]:
    """The study's failed measurements grouped by status and by the first line of their reason (at most 300
    characters), most frequent first."""
    rows = session.execute(
        select(MeasurementRow.status, MeasurementRow.reason, func.count(MeasurementRow.id))
        .where(MeasurementRow.study_id == study_id, MeasurementRow.role == role,
               MeasurementRow.status != Status.OK.value)
        .group_by(MeasurementRow.status, MeasurementRow.reason)
    ).all()
    merged: dict[tuple[str, str], int] = {}
    for status, reason, n in rows:
        first = (reason or "").strip().splitlines()[0][:300] if (reason or "").strip() else "(no reason recorded)"
        merged[(status, first)] = merged.get((status, first), 0) + int(n)
    return [FailureGroup(s, r, n) for (s, r), n in sorted(merged.items(), key=lambda item: (-item[1], item[0]))]


@dataclass(frozen=True)
class RoundEntry:
    """One candidate of a final round: ``candidate`` is 'config', 'default' or 'comparator:<name>'."""

    candidate: str
    status: str
    median_us: float | None
    p20_us: float | None
    p80_us: float | None
    config_json: str


@dataclass(frozen=True)
class StudyOutcome:
    """What a study found, without its trial records: the entries of the final round that published its
    best, else of its latest (by id; empty when it has none), its measured sweep trials (INVALID configs
    left out) and how many of them did not end OK, and the wall time its search ran
    (:func:`tuner.store.records.active_seconds`; None under two trials)."""

    study_id: int
    final: tuple[RoundEntry, ...]
    trials: int
    failed: int
    search_s: float | None


def study_outcomes(session: Session, *, study_ids: Sequence[int]) -> dict[int, StudyOutcome]:
    """The outcome of each of these studies (a study that does not exist is left out); five queries per
    :data:`~tuner.db._chunks.IN_CHUNK` studies, reading the final rounds' rows and the trials' times, not the
    trial records."""
    out: dict[int, StudyOutcome] = {}
    for ids in in_chunks(study_ids):
        out.update(_outcomes(session, ids))
    return out


def _outcomes(session: Session, ids: list[int]) -> dict[int, StudyOutcome]:
    """:func:`study_outcomes` of these distinct ids (at most IN_CHUNK: the final rounds' query binds two
    parameters per study)."""
    newest = (
        select(func.max(MeasurementRow.id))
        .where(MeasurementRow.study_id.in_(ids), MeasurementRow.role == "final",
               MeasurementRow.round_id.is_not(None))
        .group_by(MeasurementRow.study_id)
    )
    # the round that published the study's best, else the newest (a later round that published nothing, its
    # job cancelled while it ran, is not what the lookup serves)
    published_rows = select(BestConfigRow.measurement_id).where(BestConfigRow.study_id.in_(ids))
    published: dict[int, str | None] = {}
    latest: dict[int, str | None] = {}
    for sid, rid, is_published in session.execute(
        select(MeasurementRow.study_id, MeasurementRow.round_id, MeasurementRow.id.in_(published_rows))
        .where(or_(MeasurementRow.id.in_(newest), MeasurementRow.id.in_(published_rows)),
               MeasurementRow.role == "final", MeasurementRow.round_id.is_not(None))
    ):
        (published if is_published else latest)[sid] = rid
    rounds = {(sid, published[sid] if sid in published else latest[sid]) for sid in published.keys() | latest.keys()}
    final: dict[int, list[RoundEntry]] = {}
    if rounds:
        rows = session.execute(
            select(MeasurementRow.study_id, MeasurementRow.round_id, MeasurementRow.candidate,
                   MeasurementRow.status, MeasurementRow.median_us, MeasurementRow.p20_us, MeasurementRow.p80_us,
                   MeasurementRow.config_json)
            .where(MeasurementRow.study_id.in_([sid for sid, _ in rounds]), MeasurementRow.role == "final",
                   MeasurementRow.round_id.in_([rid for _, rid in rounds]))
            .order_by(MeasurementRow.id)
        ).all()
        for sid, rid, candidate, status, median, p20, p80, config_json in rows:
            if (sid, rid) in rounds:
                final.setdefault(sid, []).append(RoundEntry(candidate, status, median, p20, p80, config_json))
    counts: dict[int, dict[str, int]] = {}
    for sid, status, n in session.execute(
        select(MeasurementRow.study_id, MeasurementRow.status, func.count(MeasurementRow.id))
        .where(MeasurementRow.study_id.in_(ids), MeasurementRow.role == "trial")
        .group_by(MeasurementRow.study_id, MeasurementRow.status)
    ):
        counts.setdefault(sid, {})[status] = int(n)
    stamps: dict[int, list[datetime]] = {}
    for sid, created in session.execute(
        select(MeasurementRow.study_id, MeasurementRow.created_at)
        .where(MeasurementRow.study_id.in_(ids), MeasurementRow.role == "trial",
               MeasurementRow.status != Status.INVALID.value)
    ):
        stamps.setdefault(sid, []).append(as_utc(created))
    existing = set(session.scalars(select(StudyRow.id).where(StudyRow.id.in_(ids))))
    out = {}
    for sid in ids:
        if sid not in existing:
            continue
        by_status = counts.get(sid, {})
        measured = sum(n for status, n in by_status.items() if status != Status.INVALID.value)
        out[sid] = StudyOutcome(sid, tuple(final.get(sid, ())), measured,
                                measured - by_status.get(Status.OK.value, 0), active_seconds(stamps.get(sid, [])))
    return out
