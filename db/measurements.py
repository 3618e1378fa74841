"""Repository functions for measurements: every measured candidate, success or failure, is one row.

Functions take a session from :meth:`db.Store.session` first and keyword arguments after it; they
return :mod:`tuner.store.records`. Lookups return None / empty lists when nothing matches; a write naming a
study that does not exist raises :class:`tuner.errors.NotFoundError`; invalid arguments ValueError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session, aliased

from tuner.db._chunks import in_chunks
from tuner.db._convert import JsonInput, canonical_json, to_record
from tuner.db.models import MeasurementRow, StudyRow
from tuner.errors import NotFoundError
from tuner.store.protocols import ORDERS
from tuner.store.records import (
    DEFAULT_LABEL,
    MeasurementRecord,
    NewMeasurement,
    Status,
    Timer,
    check_candidate,
    check_role,
    storable_text,
)


def add_measurement(
    session: Session,
    *,
    study_id: int,
    role: str,
    candidate: str,
    config_json: JsonInput,
    status: Status | str,
    round_id: str | None = None,
    trial_number: int | None = None,
    reason: str | None = None,
    errors_json: JsonInput = "{}",
    kernels_json: JsonInput = "{}",
    median_us: float | None = None,
    p20_us: float | None = None,
    p80_us: float | None = None,
    mean_us: float | None = None,
    min_us: float | None = None,
    max_us: float | None = None,
    n_samples: int | None = None,
    timer: Timer | str | None = None,
    build_s: float | None = None,
    verify_s: float | None = None,
    measure_s: float | None = None,
    worker: str | None = None,
    device_index: int | None = None,
    device_uuid: str | None = None,
) -> MeasurementRecord:
    """Store one measurement of a study and return it (with its id).

    ``role`` is 'trial' or 'final'; ``candidate`` is 'config', 'default' or 'comparator:<name>';
    ``status`` a :class:`tuner.results.Status` (or its value); JSON fields accept a mapping or JSON text.
    Raises NotFoundError if the study does not exist; ValueError for an invalid role, candidate,
    status, timer or JSON.
    """
    check_role(role)
    check_candidate(candidate)
    if session.get(StudyRow, study_id) is None:
        raise NotFoundError(f"no study with id {study_id}")
    row = MeasurementRow(
        study_id=study_id,
        role=role,
        round_id=round_id,
        candidate=candidate,
        trial_number=trial_number,
        config_json=canonical_json(config_json, what="config_json"),
        status=Status(status).value,
        reason=storable_text(reason),
        errors_json=canonical_json(errors_json, what="errors_json"),
        kernels_json=canonical_json(kernels_json, what="kernels_json"),
        median_us=median_us,
        p20_us=p20_us,
        p80_us=p80_us,
        mean_us=mean_us,
        min_us=min_us,
        max_us=max_us,
        n_samples=n_samples,
        timer=None if timer is None else Timer(timer).value,
        build_s=build_s,
        verify_s=verify_s,
        measure_s=measure_s,
        worker=worker,
        device_index=device_index,
        device_uuid=device_uuid,
    )
    session.add(row)
    session.flush()
    return to_record(MeasurementRecord, row)


def add_new(session: Session, measurement: NewMeasurement) -> MeasurementRecord:
    """:func:`add_measurement` of a :class:`tuner.store.records.NewMeasurement` (same errors)."""
    fields = {f.name: getattr(measurement, f.name) for f in dataclasses.fields(measurement)}
    return add_measurement(session, **fields)


def get_measurement(session: Session, *, measurement_id: int) -> MeasurementRecord | None:
    row = session.get(MeasurementRow, measurement_id)
    return None if row is None else to_record(MeasurementRecord, row)


def list_measurements(
    session: Session,
    *,
    study_id: int,
    role: str | None = None,
    status: Status | str | None = None,
    candidate: str | None = None,
    round_id: str | None = None,
    config_json: str | None = None,
    limit: int | None = None,
    offset: int = 0,
    order: str = "id",
) -> list[MeasurementRecord]:
    """Measurements of a study matching the filters (None: any), in ``order`` (one of ORDERS).

    ``order='median_us'`` lists the fastest first and rows without a time last (ties by id).
    Raises ValueError for an unknown order, role or status.
    """
    # Plain rows, not ORM entities: a sweep has hundreds of measurements, and building an entity (identity
    # map, instance state) costs several times more than the record made from it.
    query = _filtered(select(*MeasurementRow.__table__.columns), study_id, role, status, candidate, round_id,
                      config_json)
    if order == "id":
        query = query.order_by(MeasurementRow.id)
    elif order == "-id":
        query = query.order_by(MeasurementRow.id.desc())
    elif order == "median_us":
        query = query.order_by(
            MeasurementRow.median_us.is_(None), MeasurementRow.median_us, MeasurementRow.id
        )
    else:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}; got {order!r}")
    query = query.offset(offset).limit(limit)
    return [to_record(MeasurementRecord, row) for row in session.execute(query)]


def count_measurements(
    session: Session,
    *,
    study_id: int,
    role: str | None = None,
    status: Status | str | None = None,
    candidate: str | None = None,
    round_id: str | None = None,
    config_json: str | None = None,
) -> int:
    """How many measurements :func:`list_measurements` would list without limit (same filters)."""
    query = _filtered(
        select(func.count(MeasurementRow.id)), study_id, role, status, candidate, round_id, config_json
    )
    return int(session.scalar(query) or 0)


def latest_round(session: Session, *, study_id: int) -> list[MeasurementRecord]:
    """The rows of the study's most recent final round (the one holding the newest final row), by id.

    Empty when the study has no final measurement with a round_id.
    """
    newest = (
        select(MeasurementRow.round_id)
        .where(
            MeasurementRow.study_id == study_id,
            MeasurementRow.role == "final",
            MeasurementRow.round_id.is_not(None),
        )
        .order_by(MeasurementRow.id.desc())
        .limit(1)
    )
    round_id = session.scalar(newest)
    if round_id is None:
        return []
    return list_measurements(session, study_id=study_id, role="final", round_id=round_id)


def _filtered(
    query: Select[Any],
    study_id: int,
    role: str | None,
    status: Status | str | None,
    candidate: str | None,
    round_id: str | None,
    config_json: str | None = None,
) -> Select[Any]:
    query = query.where(MeasurementRow.study_id == study_id)
    if role is not None:
        check_role(role)
        query = query.where(MeasurementRow.role == role)
    if status is not None:
        query = query.where(MeasurementRow.status == Status(status).value)
    if candidate is not None:
        query = query.where(MeasurementRow.candidate == candidate)
    if round_id is not None:
        query = query.where(MeasurementRow.round_id == round_id)
    if config_json is not None:
        query = query.where(MeasurementRow.config_json == canonical_json(config_json, what="config_json"))
    return query


def round_defaults(session: Session, *, measurement_ids: Sequence[int]) -> dict[int, float]:
    """For each of these final-round measurements, the median of the OK ``default`` candidate of the same
    study and round (itself when it is the default); ids without one are left out. One query per
    :data:`~tuner.db._chunks.IN_CHUNK` ids."""
    default = aliased(MeasurementRow)
    found: dict[int, float] = {}
    for ids in in_chunks(measurement_ids):
        rows = session.execute(
            select(MeasurementRow.id, default.median_us)
            .join(default,
                  (default.study_id == MeasurementRow.study_id) & (default.round_id == MeasurementRow.round_id))
            .where(MeasurementRow.id.in_(ids), MeasurementRow.role == "final", default.role == "final",
                   default.candidate == DEFAULT_LABEL, default.status == Status.OK.value,
                   default.median_us.is_not(None))
        )
        found.update({int(i): float(us) for i, us in rows if us is not None})
    return found
