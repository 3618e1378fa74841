"""Repository functions for verifications: published bests re-measured in fresh processes (``tuner verify``).

Functions take a session from :meth:`db.Store.session` first and keyword arguments after it; they return
:mod:`db.records`. A verification belongs to the study whose best it re-measured; it is kept, never replaced
(the history of re-measurements is the evidence), and the latest one is the one answers show.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner.db._chunks import in_chunks
from tuner.db._convert import canonical_json, to_record
from tuner.db.best import publish_best, withdraw_best
from tuner.db.models import BestConfigRow, MeasurementRow, StudyRow, TaskRow, VerificationRow, store_now
from tuner.errors import NotFoundError, SlotLostError
from tuner.store.records import (
    COMPARATOR_PREFIX,
    BestRecord,
    Disproval,
    RoundHold,
    Status,
    VerificationRecord,
    check_disproval,
)


def add_verification(
    session: Session,
    *,
    study_id: int,
    config_json: str,
    stored_us: float,
    median_us: float | None,
    low_us: float | None,
    high_us: float | None,
    drift: float | None,
    tolerance: float,
    flagged: bool,
    processes: int,
    figures: Sequence[Mapping[str, Any]],
    device_kind: str,
    device_name: str,
    fingerprint_hash: str,
    fingerprint_json: str,
    worker: str | None = None,
) -> VerificationRecord:
    """Store one verification of a study's best; NotFoundError if the study does not exist, ValueError for
    non-JSON figures or a non-positive process count."""
    if session.get(StudyRow, study_id) is None:
        raise NotFoundError(f"no study with id {study_id}")
    if processes < 1:
        raise ValueError(f"a verification runs at least one process, got {processes}")
    row = VerificationRow(
        study_id=study_id, config_json=canonical_json(config_json, what="config_json"), stored_us=stored_us,
        median_us=median_us, low_us=low_us, high_us=high_us, drift=drift, tolerance=tolerance, flagged=flagged,
        processes=processes, figures_json=json.dumps(list(figures), sort_keys=True, separators=(",", ":")),
        device_kind=device_kind, device_name=device_name, fingerprint_hash=fingerprint_hash,
        fingerprint_json=fingerprint_json, worker=worker, created_at=store_now(session),  # the store's clock
    )
    session.add(row)
    session.flush()
    return to_record(VerificationRecord, row)


def record_disproval(
    session: Session,
    *,
    best_measurement_id: int | None,
    stand_in_id: int | None = None,
    withdraw: bool = False,
    **verification: Any,
) -> Disproval | None:
    """Store a verification that found its config wrong and act on the study's best in the same session: publish
    the stand-in (keeping the replaced best's ``published_at``) or withdraw the best, as the caller decided on
    the best whose measurement id is ``best_measurement_id`` (None: none); when the study's best is another
    one now, store nothing and return None. The study's row and its best's are locked (``FOR UPDATE`` on
    PostgreSQL; a write session holds SQLite's write lock) until the transaction ends: a concurrent
    :func:`tuner.db.best.publish_best` waits, on the best row when there is one, else on the study row its
    foreign key shares; when the stand-in's config was found wrong since the caller read (a final round's
    WRONG_RESULT: its insert waits on the study row too), store nothing and return None. Raises as
    :meth:`tuner.store.TuningStore.record_disproval` (the caller's session rolls back what was written)."""
    study_id = verification["study_id"]
    study = session.get(StudyRow, study_id, with_for_update=True)
    if study is None:
        raise NotFoundError(f"no study with id {study_id}")
    check_disproval(best_measurement_id=best_measurement_id, stand_in_id=stand_in_id, withdraw=withdraw,
                    figures=verification["figures"], device_name=verification["device_name"],
                    study_device_name=study.device_name)
    current = session.scalars(
        select(BestConfigRow).where(BestConfigRow.study_id == study_id).with_for_update()
    ).one_or_none()
    if (None if current is None else current.measurement_id) != best_measurement_id:
        return None  # a final round published meanwhile: the caller decides again
    if stand_in_id is not None:  # a final round found the stand-in wrong meanwhile: decide again
        stand_in = session.get(MeasurementRow, stand_in_id)
        if stand_in is not None and stand_in.status == Status.OK.value and _found_wrong(session, study_id, stand_in):
            return None
    record = add_verification(session, **verification)
    replacement = None
    if stand_in_id is not None:
        assert current is not None  # check_disproval: a stand-in names the best it replaces
        replacement = publish_best(session, study_id=study_id, measurement_id=stand_in_id,
                                   published_at=current.published_at)
    withdrawn = withdraw and withdraw_best(session, study_id=study_id)
    return Disproval(record, replacement, withdrawn)


def publish_unless_disproved(session: Session, *, study_id: int, measurement_id: int,
                             published_at: datetime | None = None, replacing: int | None = None,
                             holding: RoundHold | None = None) -> BestRecord | None:
    """:func:`tuner.db.best.publish_best` unless the measurement's config is among the study's
    :func:`disproved_configs`, or, with ``replacing``, unless the study's best is that measurement's (then
    None), the study's row locked meanwhile (``FOR UPDATE`` on PostgreSQL; a write session holds SQLite's
    write lock) as :func:`record_disproval` and :func:`tuner.db.best.publish_best` lock it: they are
    serialised. With ``holding``, the task's row is locked first and must still be finalising with that worker
    as its finaliser (else SlotLostError). Raises as publish_best."""
    if holding is not None:
        task = session.get(TaskRow, holding.task_id, with_for_update=True)
        if task is None or task.state != "finalizing" or task.finalizer_id != holding.worker_id:
            raise SlotLostError(f"worker {holding.worker_id} no longer holds the final round of task "
                                f"{holding.task_id}: it was declared lost and the round given to another worker")
    study = session.get(StudyRow, study_id, with_for_update=True)
    if study is None:
        raise NotFoundError(f"no study with id {study_id}")
    if _found_wrong(session, study_id, session.get(MeasurementRow, measurement_id)):
        return None
    if replacing is not None:
        current = session.scalars(
            select(BestConfigRow.measurement_id).where(BestConfigRow.study_id == study_id)).first()
        if current != replacing:
            return None
    return publish_best(session, study_id=study_id, measurement_id=measurement_id, published_at=published_at)


def _found_wrong(session: Session, study_id: int, measurement: MeasurementRow | None) -> bool:
    """Whether ``measurement`` is one of the study's and its config is among the study's
    :func:`disproved_configs`."""
    return (measurement is not None and measurement.study_id == study_id
            and measurement.config_json in disproved_configs(session, study_ids=[study_id]).get(study_id, ()))


def latest_verification(session: Session, *, study_id: int) -> VerificationRecord | None:
    """The study's most recent verification, or None."""
    query = (
        select(VerificationRow).where(VerificationRow.study_id == study_id)
        .order_by(VerificationRow.created_at.desc(), VerificationRow.id.desc()).limit(1)
    )
    row = session.scalars(query).first()
    return None if row is None else to_record(VerificationRecord, row)


def latest_verifications(session: Session, *, study_ids: Sequence[int]) -> dict[int, VerificationRecord]:
    """The most recent verification of each of these studies that has one (one query per
    :data:`~tuner.db._chunks.IN_CHUNK` studies)."""
    found: dict[int, VerificationRecord] = {}
    for chunk in in_chunks(study_ids):
        rows = session.scalars(
            select(VerificationRow).where(VerificationRow.study_id.in_(chunk))
            .order_by(VerificationRow.created_at, VerificationRow.id)
        )
        found.update({row.study_id: to_record(VerificationRecord, row) for row in rows})  # later rows win
    return found


def disproved_configs(session: Session, *, study_ids: Sequence[int]) -> dict[int, frozenset[str]]:
    """For each of these studies that has any, the configs (``config_json``) found wrong: WRONG_RESULT in a
    final round (comparators left out), or in a verification on the study's own device name (the verified
    config WRONG_RESULT in some process: :attr:`VerificationRecord.wrong_processes`, read from the figures).
    Two queries per :data:`~tuner.db._chunks.IN_CHUNK` studies."""
    found: dict[int, set[str]] = {}
    for ids in in_chunks(study_ids):
        _add_disproved(session, ids, found)
    return {study_id: frozenset(configs) for study_id, configs in found.items()}


def _add_disproved(session: Session, ids: list[int], found: dict[int, set[str]]) -> None:
    """Add the configs found wrong in these studies (as :func:`disproved_configs`) to ``found``."""
    finals = session.execute(
        select(MeasurementRow.study_id, MeasurementRow.config_json).distinct()
        .where(MeasurementRow.study_id.in_(ids), MeasurementRow.role == "final",
               MeasurementRow.status == Status.WRONG_RESULT.value,
               ~MeasurementRow.candidate.startswith(COMPARATOR_PREFIX, autoescape=True))
    )
    for study_id, config_json in finals:
        found.setdefault(int(study_id), set()).add(config_json)
    checks = session.scalars(
        select(VerificationRow).join(StudyRow, StudyRow.id == VerificationRow.study_id)
        .where(VerificationRow.study_id.in_(ids), VerificationRow.device_name == StudyRow.device_name)
    )
    for row in checks:
        check = to_record(VerificationRecord, row)
        if check.wrong_processes:
            found.setdefault(check.study_id, set()).add(check.config_json)


def list_verifications(
    session: Session, *, study_id: int | None = None, template: str | None = None, limit: int = 100
) -> list[VerificationRecord]:
    """Verifications, newest first, of one study or of a template's studies (None: any)."""
    query = select(VerificationRow)
    if study_id is not None:
        query = query.where(VerificationRow.study_id == study_id)
    if template is not None:
        query = query.join(StudyRow, StudyRow.id == VerificationRow.study_id).where(StudyRow.template == template)
    query = query.order_by(VerificationRow.created_at.desc(), VerificationRow.id.desc()).limit(limit)
    return [to_record(VerificationRecord, row) for row in session.scalars(query)]
