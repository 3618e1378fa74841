"""Best-config lookup with its fallback chain: exact key → nearest entry → template default.

Used by the API (over the store's best configs) and by the runtime client (over an exported file), so both
answer alike. Pure Python: no torch, no store, no templates (constraints arrive as expressions).

Who asks (:class:`Requester`): optionally the device name, the software it runs (driver, runtime — CUDA or
CANN — and library versions) and the template version. Each given field is compared with what the entry
was verified under (:attr:`Entry.software`, the study's fingerprint); a field the requester leaves out is
not compared (and listed in :attr:`Answer.unchecked`), so older callers get the answers they always got.
Libraries the template's backend does not use are not compared (a Triton template ignores tilelang).

Order: entries of the requester's device name first, then those of its software, then the nearest shape
(:mod:`tuner.distance`, its weights fitted over the entries), then the most recently published; entries
farther than the distance's ``max_distance`` are not used. An answer is ``exact`` only when the shape is
the entry's and nothing compared differs; otherwise ``nearest``, with every difference listed
(:class:`Difference`: shape dims, device name, template version, software). A nearest entry is used only if
its config satisfies the template's constraints for the *requested* shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tuner.distance import DEFAULT_DISTANCE, ShapeDistance

Match = Literal["exact", "nearest", "default"]

# Software fields that are compared whatever the backend; a backend's own library (``triton``, ``tilelang``)
# is compared for templates of that backend only.
COMMON_SOFTWARE = ("driver", "runtime", "torch", "torch_npu")
BACKEND_LIBRARIES = ("triton", "tilelang")


@dataclass(frozen=True)
class Entry:
    """One published best config (a row of the store's best table, or of an export file).

    ``software``: what it was verified under — ``driver``, ``runtime`` and the library versions of the
    study's fingerprint (None when unknown, e.g. an export file written before fingerprints were exported).
    """

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
    software: Mapping[str, str] | None = None
    # The latest re-measurement of this best in fresh processes (``tuner verify``), as
    # :func:`verification_summary` gives it; None if it was never verified.
    verification: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Entry:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def verification_summary(
    *, verified_at: str, median_us: float | None, stored_us: float, drift: float | None, tolerance: float,
    flagged: bool, processes: int, device_name: str, fingerprint_hash: str,
) -> dict[str, Any]:
    """The figures of a verification that answers carry (API, export file, client)."""
    return {"verified_at": verified_at, "median_us": median_us, "stored_us": stored_us, "drift": drift,
            "tolerance": tolerance, "flagged": flagged, "processes": processes, "device_name": device_name,
            "fingerprint": fingerprint_hash}


def verification_note(summary: Mapping[str, Any]) -> str | None:
    """A note for an answer whose entry's latest verification is flagged, else None."""
    if not summary.get("flagged"):
        return None
    when = str(summary.get("verified_at", ""))[:19]
    if summary.get("drift") is None:
        return f"verification of {when}: the config did not measure OK in any fresh process"
    return (f"verification of {when} drifted {100 * float(summary['drift']):+.1f}% (beyond "
            f"±{100 * float(summary['tolerance']):g}%): {summary['median_us']:.2f} µs over "
            f"{summary['processes']} fresh processes against {summary['stored_us']:.2f} µs stored")


@dataclass(frozen=True)
class Requester:
    """Who asks: fields left None / empty are not compared. Immutable."""

    device_name: str | None = None
    software: Mapping[str, str] = field(default_factory=dict)  # driver, runtime, torch, triton, tilelang…
    template_version: str | None = None
    backend: str | None = None  # the template's backend (which library to compare); None: all given

    def compared_software(self) -> dict[str, str]:
        """The software fields compared: all given, less the libraries of other backends."""
        return {k: v for k, v in self.software.items()
                if k not in BACKEND_LIBRARIES or self.backend is None or k == self.backend}


@dataclass(frozen=True)
class Difference:
    """One thing that differs between the request and the entry served (``entry`` None: unknown)."""

    what: str  # 'shape.<dim>' | 'device_name' | 'template_version' | a software field ('triton', 'driver'…)
    requested: Any
    entry: Any

    def __str__(self) -> str:
        return f"{self.what}: requested {self.requested}, entry {self.entry if self.entry is not None else 'unknown'}"


@dataclass(frozen=True)
class Answer:
    """The answer to a lookup: which config to use and why."""

    match: Match
    config: Mapping[str, Any]
    entry: Entry | None = None  # the entry the config comes from (None for the default)
    distance: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    differences: tuple[Difference, ...] = ()
    unchecked: tuple[str, ...] = ()  # fields the requester did not give, hence not compared

    @property
    def foreign(self) -> bool:
        """Whether the entry was verified on another device name or software than the requester's."""
        return any(not d.what.startswith("shape.") and d.what != "template_version" for d in self.differences)


def shape_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """The lookup's distance (:data:`tuner.distance.DEFAULT_DISTANCE`) before any fitting (every integer dim
    weighs 1); ``inf`` when not comparable."""
    return DEFAULT_DISTANCE(a, b)


def differences(shape: Mapping[str, Any], entry: Entry, requester: Requester) -> list[Difference]:
    """What differs between a request and an entry: shape dims, then the requester's given fields."""
    found = [Difference(f"shape.{k}", shape.get(k), entry.shape.get(k))
             for k in sorted(set(shape) | set(entry.shape)) if shape.get(k) != entry.shape.get(k)]
    if requester.device_name is not None and requester.device_name != entry.device_name:
        found.append(Difference("device_name", requester.device_name, entry.device_name))
    if requester.template_version is not None and requester.template_version != entry.template_version:
        found.append(Difference("template_version", requester.template_version, entry.template_version))
    software = entry.software or {}
    for k, v in sorted(requester.compared_software().items()):
        if software.get(k) != v:
            found.append(Difference(k, v, software.get(k)))
    return found


def unchecked_fields(requester: Requester) -> tuple[str, ...]:
    """The fingerprint fields a requester left out (the answer could not compare them)."""
    missing = [name for name, given in (("device_name", requester.device_name),
                                        ("software", requester.software)) if not given]
    return tuple(missing)


def choose(
    shape: Mapping[str, Any],
    entries: Sequence[Entry],
    *,
    default: Mapping[str, Any] | None,
    valid: Callable[[Mapping[str, Any], Mapping[str, Any]], bool] | None = None,
    device_name: str | None = None,
    requester: Requester | None = None,
    distance: ShapeDistance = DEFAULT_DISTANCE,
) -> Answer | None:
    """Pick the config for ``shape`` among ``entries`` (already filtered to one template and device kind).

    ``valid(config, shape)`` checks a config against the template's constraints for the requested shape;
    ``requester`` (or just ``device_name``) says who asks, see the module docstring. Returns None when there
    is neither a usable entry nor a default. Never raises for well-formed entries.
    """
    who = requester if requester is not None else Requester(device_name=device_name)
    software = who.compared_software()
    distance = distance.fitted((e.shape, e.config) for e in entries)

    def rank(e: Entry) -> tuple[bool, bool, float]:
        other_device = who.device_name is not None and e.device_name != who.device_name
        other_software = any((e.software or {}).get(k) != v for k, v in software.items())
        return other_device, other_software, distance(shape, e.shape)

    # Two stable sorts: most recent first, then by rank, so that ties go to the most recent entry.
    recent_first = sorted(entries, key=lambda e: e.published_at or "", reverse=True)
    notes: list[str] = []
    too_far = 0
    for e in sorted(recent_first, key=rank):
        d = distance(shape, e.shape)
        if math.isinf(d):
            continue
        if d > distance.max_distance:
            too_far += 1
            continue
        if valid is not None and not valid(e.config, shape):
            notes.append(f"skipped the entry for {_key(e.shape)}: its config is invalid for this shape")
            continue
        found = tuple(differences(shape, e, who))
        return Answer("nearest" if found else "exact", dict(e.config), e, d, tuple(notes), found,
                      unchecked_fields(who))
    if too_far:
        notes.append(f"{too_far} entr{'y' if too_far == 1 else 'ies'} farther than {distance.max_distance:g} "
                     "not used: a config tuned that far away loses more than the default (benchmarks/regret.md)")
    if default is None:
        return None
    return Answer("default", dict(default), None, None, tuple(notes), (), unchecked_fields(who))


def _key(shape: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={shape[k]}" for k in sorted(shape))
