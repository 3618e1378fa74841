"""Repository functions for published best configs (one per study, replaced on republish).

Functions take a session from :meth:`db.Store.session` first and keyword arguments after it; they
return :mod:`tuner.store.records`. Lookups return None / empty lists when nothing matches.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from tuner.db._convert import as_utc, to_record
from tuner.db.models import BestConfigRow, MeasurementRow, StudyRow, store_now
from tuner.errors import NotFoundError, RecordConflictError
from tuner.store.records import BestRecord, Status

_KEY_COLUMNS = (
    "template",
    "template_version",
    "shape_key",
    "shape_json",
    "device_kind",
    "device_name",
    "fingerprint_hash",
)
_FIGURE_COLUMNS = ("config_json", "median_us", "p20_us", "p80_us", "n_samples", "timer")


def publish_best(
    session: Session, *, study_id: int, measurement_id: int, published_at: datetime | None = None
) -> BestRecord:
    """Publish a measurement as its study's best config, replacing any previous one; return it.

    Copies the config and figures from the measurement and the key from the study; ``published_at`` is
    now unless given. Raises NotFoundError if the study or the measurement does not exist; RecordConflictError if
    the measurement belongs to another study, is not OK, has no median, or measured a comparator (a
    comparator is not a config of the template).
    """
    # The study's row first, as record_disproval and publish_unless_disproved lock it: every publish takes
    # study then best (an insert of a first best would otherwise take the study's key lock last: a deadlock)
    study = session.get(StudyRow, study_id, with_for_update=True)
    if study is None:
        raise NotFoundError(f"no study with id {study_id}")
    measurement = session.get(MeasurementRow, measurement_id)
    if measurement is None:
        raise NotFoundError(f"no measurement with id {measurement_id}")
    _check_publishable(measurement, study_id)
    values: dict[str, Any] = {
        "study_id": study_id,
        "measurement_id": measurement_id,
        # the store's clock (PostgreSQL's), as leases are: the lookup serves the latest published best, and
        # workers on hosts whose clocks differ must not decide that by their skew
        "published_at": store_now(session) if published_at is None else as_utc(published_at),
        **{column: getattr(study, column) for column in _KEY_COLUMNS},
        **{column: getattr(measurement, column) for column in _FIGURE_COLUMNS},
    }
    _upsert(session, values)
    return _best_of_study(session, study_id)


def get_best(
    session: Session,
    *,
    template: str,
    shape_key: str,
    device_kind: str | None = None,
    device_name: str | None = None,
    fingerprint_hash: str | None = None,
    template_version: str | None = None,
) -> BestRecord | None:
    """The most recently published best config matching the key (None in a filter: any), or None."""
    query = select(BestConfigRow).where(
        BestConfigRow.template == template,
        BestConfigRow.shape_key == shape_key,
    )
    for column, value in (
        (BestConfigRow.device_kind, device_kind),
        (BestConfigRow.device_name, device_name),
        (BestConfigRow.fingerprint_hash, fingerprint_hash),
        (BestConfigRow.template_version, template_version),
    ):
        if value is not None:
            query = query.where(column == value)
    query = query.order_by(BestConfigRow.published_at.desc(), BestConfigRow.id.desc()).limit(1)
    row = session.scalars(query).first()
    return None if row is None else to_record(BestRecord, row)


def get_study_best(session: Session, *, study_id: int) -> BestRecord | None:
    """The best config published for one study, or None."""
    row = session.scalars(select(BestConfigRow).where(BestConfigRow.study_id == study_id)).one_or_none()
    return None if row is None else to_record(BestRecord, row)


def withdraw_best(session: Session, *, study_id: int) -> bool:
    """Delete the study's published best config; whether there was one. The study's row is locked first, as
    every publish locks it (:func:`publish_best`): a withdrawal and a publish are serialised."""
    session.get(StudyRow, study_id, with_for_update=True)
    result = session.execute(delete(BestConfigRow).where(BestConfigRow.study_id == study_id))
    return bool(result.rowcount)  # type: ignore[attr-defined]


def list_best(
    session: Session,
    *,
    template: str | None = None,
    device_kind: str | None = None,
    device_name: str | None = None,
) -> list[BestRecord]:
    """Best configs matching the filters (None: any), by template, shape, device, newest first."""
    query = select(BestConfigRow)
    if template is not None:
        query = query.where(BestConfigRow.template == template)
    if device_kind is not None:
        query = query.where(BestConfigRow.device_kind == device_kind)
    if device_name is not None:
        query = query.where(BestConfigRow.device_name == device_name)
    query = query.order_by(
        BestConfigRow.template,
        BestConfigRow.shape_key,
        BestConfigRow.device_kind,
        BestConfigRow.device_name,
        BestConfigRow.published_at.desc(),
        BestConfigRow.id.desc(),
    )
    return [to_record(BestRecord, row) for row in session.scalars(query)]


def _check_publishable(measurement: MeasurementRow, study_id: int) -> None:
    what = f"measurement {measurement.id}"
    if measurement.study_id != study_id:
        raise RecordConflictError(f"{what} belongs to study {measurement.study_id}, not {study_id}")
    if measurement.status != Status.OK.value:
        raise RecordConflictError(f"{what} is {measurement.status}, only OK measurements can be published")
    if measurement.median_us is None:
        raise RecordConflictError(f"{what} has no median time to publish")
    if measurement.candidate.startswith("comparator:"):
        raise RecordConflictError(f"{what} measured {measurement.candidate}, not a config of the template")


def _upsert(session: Session, values: dict[str, Any]) -> None:
    """INSERT … ON CONFLICT (study_id) DO UPDATE on SQLite and PostgreSQL; read-then-write elsewhere."""
    dialect = session.get_bind().dialect.name
    if dialect in ("sqlite", "postgresql"):
        insert = (sqlite.insert if dialect == "sqlite" else postgresql.insert)(BestConfigRow).values(**values)
        update = {column: insert.excluded[column] for column in values if column != "study_id"}
        session.execute(insert.on_conflict_do_update(index_elements=["study_id"], set_=update))
        return
    query = select(BestConfigRow).where(BestConfigRow.study_id == values["study_id"]).with_for_update()
    row = session.scalars(query).one_or_none()
    if row is None:
        session.add(BestConfigRow(**values))
    else:
        for column, value in values.items():
            setattr(row, column, value)
    session.flush()


def _best_of_study(session: Session, study_id: int) -> BestRecord:
    # populate_existing: the Core upsert bypassed the identity map, which may hold an older row.
    query = (
        select(BestConfigRow)
        .where(BestConfigRow.study_id == study_id)
        .execution_options(populate_existing=True)
    )
    return to_record(BestRecord, session.scalars(query).one())
