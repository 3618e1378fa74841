"""Internal helpers of the repository: ORM row -> record, canonical JSON, UTC timestamps."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, TypeVar

from tuner.results import Status

_R = TypeVar("_R")

JsonInput = str | Mapping[str, Any]


def to_record(cls: type[_R], row: object) -> _R:
    """Copy the fields of record class ``cls`` from an ORM row (timestamps tagged UTC, status typed)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value = getattr(row, f.name)
        if isinstance(value, datetime):
            value = as_utc(value)
        elif f.name == "status":
            value = Status(value)
        values[f.name] = value
    return cls(**values)


def as_utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; we only ever store UTC.
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def canonical_json(value: JsonInput, *, what: str) -> str:
    """Canonical JSON text (sorted keys, no spaces) of a mapping or of JSON text; ValueError if invalid.

    NaN and infinities are kept (Python's JSON extension): relative errors of NaN outputs are NaN.
    """
    if isinstance(value, str):
        try:
            data = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{what}: not valid JSON ({exc})") from exc
    else:
        data = value
    try:
        return json.dumps(data, sort_keys=True, separators=(",", ":"), default=_mapping_as_dict)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: cannot be stored as JSON ({exc})") from exc


def _mapping_as_dict(value: object) -> dict[str, Any]:
    if isinstance(value, Mapping):  # tuner.frozen maps (Shape, Config) are Mappings, not dicts
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
