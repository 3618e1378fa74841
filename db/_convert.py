"""Internal helpers of the repository: ORM row -> record, UTC timestamps (canonical JSON lives in
:mod:`tuner.store.records`)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from functools import cache
from typing import Any, TypeVar

from tuner.store.records import JsonInput, Status, canonical_json

_R = TypeVar("_R")

__all__ = ["JsonInput", "as_utc", "canonical_json", "to_record"]


def to_record(cls: type[_R], row: object) -> _R:
    """Copy the fields of record class ``cls`` from an ORM row or a result row (timestamps tagged UTC, status
    typed)."""
    values: dict[str, Any] = {}
    for name in _field_names(cls):  # type: ignore[arg-type]
        value = getattr(row, name)
        if isinstance(value, datetime):
            value = as_utc(value)
        elif name == "status":
            value = Status(value)
        values[name] = value
    return cls(**values)


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def as_utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; we only ever store UTC.
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
