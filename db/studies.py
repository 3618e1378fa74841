"""Repository functions for studies (one row per study key).

Functions take a session from :meth:`db.Store.session` first and keyword arguments after it; they
return :mod:`tuner.store.records`, never ORM rows. Lookups return None when nothing matches.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuner.db._convert import JsonInput, canonical_json, to_record
from tuner.db.models import StudyRow
from tuner.errors import RecordConflictError
from tuner.store.records import StudyRecord

KEY_FIELDS = ("template", "template_version", "shape_key", "device_kind", "device_name", "fingerprint_hash")


def get_or_create_study(
    session: Session,
    *,
    name: str,
    template: str,
    template_version: str,
    shape_key: str,
    shape_json: JsonInput,
    device_kind: str,
    device_name: str,
    fingerprint_hash: str,
    fingerprint_json: JsonInput,
) -> StudyRecord:
    """The study named ``name``, created with these fields if absent. Race-safe across processes.

    When two callers create the same study at once, both get the one row: the loser's INSERT fails on
    the unique name inside a SAVEPOINT, which is rolled back before the row is read again. An existing
    study keeps its stored JSON (fingerprint info such as the clock may differ between workers).

    Raises RecordConflictError if ``name`` is stored with a different key, or the key under another
    name; ValueError for invalid JSON.
    """
    key = {
        "template": template,
        "template_version": template_version,
        "shape_key": shape_key,
        "device_kind": device_kind,
        "device_name": device_name,
        "fingerprint_hash": fingerprint_hash,
    }
    row = _row_by_name(session, name)
    if row is None:
        fields = dict(key, name=name)
        fields["shape_json"] = canonical_json(shape_json, what="shape_json")
        fields["fingerprint_json"] = canonical_json(fingerprint_json, what="fingerprint_json")
        try:
            with session.begin_nested():
                row = StudyRow(**fields)
                session.add(row)
        except IntegrityError:
            row = _row_by_name(session, name)
            if row is None:
                other = session.scalars(select(StudyRow.name).filter_by(**key)).first()
                if other is None:
                    raise  # neither name nor key taken: some other integrity failure
                raise RecordConflictError(
                    f"study {name!r}: its key is already stored under the name {other!r}"
                ) from None
    _check_same_key(row, key)
    return to_record(StudyRecord, row)


def get_study(
    session: Session, *, name: str | None = None, study_id: int | None = None
) -> StudyRecord | None:
    """The study with this name or id (exactly one of them), or None. ValueError if both/neither given."""
    if (name is None) == (study_id is None):
        raise ValueError("get_study: give exactly one of name= and study_id=")
    row = session.get(StudyRow, study_id) if study_id is not None else _row_by_name(session, str(name))
    return None if row is None else to_record(StudyRecord, row)


def list_studies(
    session: Session, *, template: str | None = None, device_kind: str | None = None
) -> list[StudyRecord]:
    """Studies matching the filters (None: any), oldest first."""
    query = select(StudyRow).order_by(StudyRow.id)
    if template is not None:
        query = query.where(StudyRow.template == template)
    if device_kind is not None:
        query = query.where(StudyRow.device_kind == device_kind)
    return [to_record(StudyRecord, row) for row in session.scalars(query)]


def _row_by_name(session: Session, name: str) -> StudyRow | None:
    return session.scalars(select(StudyRow).where(StudyRow.name == name)).one_or_none()


def _check_same_key(row: StudyRow, key: dict[str, str]) -> None:
    stored = {field: getattr(row, field) for field in KEY_FIELDS}
    if stored != key:
        diff = ", ".join(
            f"{f}: stored {stored[f]!r}, given {key[f]!r}" for f in KEY_FIELDS if stored[f] != key[f]
        )
        raise RecordConflictError(f"study {row.name!r} exists with another key ({diff})")
