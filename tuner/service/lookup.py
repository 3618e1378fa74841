"""Best-config lookup with its fallback chain: exact key → nearest shape → template default.

Used by the API (over the store's best configs) and by the runtime client (over an exported file), so both
answer alike. Pure Python: no torch, no store, no templates (constraints arrive as expressions).

Distance between two shapes of one template (documented in the README): shapes whose non-integer dims
(dtypes, flags) differ, or whose dim names differ, are not comparable (infinite distance); otherwise the
distance is ``Σ |log2(a_d / b_d)|`` over the integer dims d — doubling one dim costs 1, whatever its size.
Ties are broken by the most recently published entry. A nearest entry is used only if its config satisfies
the template's constraints for the *requested* shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Match = Literal["exact", "nearest", "default"]


@dataclass(frozen=True)
class Entry:
    """One published best config (a row of the store's best table, or of an export file)."""

    template: str
    template_version: str
    shape: Mapping[str, Any]
    device_kind: str
    device_name: str
    config: Mapping[str, Any]
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    n_samples: int | None = None
    timer: str | None = None
    fingerprint_hash: str | None = None
    measurement_id: int | None = None
    published_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Entry:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class Answer:
    """The answer to a lookup: which config to use and why."""

    match: Match
    config: Mapping[str, Any]
    entry: Entry | None = None  # the entry the config comes from (None for the default)
    distance: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def shape_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """The documented distance; ``inf`` when the shapes are not comparable."""
    if set(a) != set(b):
        return math.inf
    total = 0.0
    for name, av in a.items():
        bv = b[name]
        if isinstance(av, bool) or isinstance(bv, bool) or not isinstance(av, int) or not isinstance(bv, int):
            if av != bv:
                return math.inf
            continue
        if av <= 0 or bv <= 0:
            if av != bv:
                return math.inf
            continue
        total += abs(math.log2(av / bv))
    return total


def choose(
    shape: Mapping[str, Any],
    entries: Sequence[Entry],
    *,
    default: Mapping[str, Any] | None,
    valid: Callable[[Mapping[str, Any], Mapping[str, Any]], bool] | None = None,
    device_name: str | None = None,
) -> Answer | None:
    """Pick the config for ``shape`` among ``entries`` (already filtered to one template and device kind).

    ``valid(config, shape)`` checks a config against the template's constraints for the requested shape;
    ``device_name`` prefers entries of that device (others are used only when it has none). Returns None
    when there is neither a usable entry nor a default.
    """
    pool = [e for e in entries if device_name is None or e.device_name == device_name] or list(entries)
    # Two stable sorts: most recent first, then by distance, so that ties go to the most recent entry.
    recent_first = sorted(pool, key=lambda e: e.published_at or "", reverse=True)
    ranked = sorted(recent_first, key=lambda e: shape_distance(shape, e.shape))
    notes: list[str] = []
    for e in ranked:
        d = shape_distance(shape, e.shape)
        if math.isinf(d):
            break
        if valid is not None and not valid(e.config, shape):
            notes.append(f"skipped the entry for {_key(e.shape)}: its config is invalid for this shape")
            continue
        return Answer("exact" if d == 0 else "nearest", dict(e.config), e, d, tuple(notes))
    if default is None:
        return None
    return Answer("default", dict(default), None, None, tuple(notes))


def _key(shape: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={shape[k]}" for k in sorted(shape))
