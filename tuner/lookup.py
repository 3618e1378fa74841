"""Best-config lookup with its fallback chain: exact key → nearest entry → template default.

Used by the API (over the store's best configs) and by the runtime client (over an exported file), so both
answer alike. Pure Python: no torch, no store, no templates (constraints arrive as expressions).

Who asks (:class:`Requester`): optionally the device name, the software it runs (driver, runtime — CUDA or
CANN — and library versions) and the template version. Each given field is compared with what the entry
was verified under (:attr:`Entry.software`, the study's fingerprint); a field the requester leaves out is
not compared (and listed in :attr:`Answer.unchecked`), so older callers get the answers they always got.
Libraries the template's backend does not use are not compared (a Triton template ignores tilelang).

Order: entries of the requester's device name first, then those of its software, then the nearest shape
(:mod:`tuner.distance`, its weights fitted over the entries), then the most recently published — except that
entries farther than :data:`NEAR_DISTANCE` come after all entries within it; entries farther than the distance's
``max_distance`` are not used, and another shape's entry is used only if its config beat the template's
default on its own shape by enough for its distance (the *gain gate*, :func:`required_gain`). An answer is
``exact`` only when the shape is the entry's and nothing compared differs; otherwise ``nearest``, with every
difference listed (:class:`Difference`: shape dims, device name, template version, software). A nearest entry
is used only if its config satisfies the template's constraints for the *requested* shape.

Config repair: when an entry's config breaks a constraint for the requested shape and the parameters' domains
are given (:class:`Domain`, from the search space), the smallest change that makes it valid is served
instead of skipping the entry (:func:`repair_config`): one parameter changed to another value of its domain
(a numeric one costs ``|log2|`` of the ratio of its values — a doubling costs 1 —, a categorical or bool
one 1), else two parameters changed, each to a neighbouring value (the next value either side for numeric
parameters, any value for the others); the cheapest valid repair wins, ties in the domains' order then the
values' order. E.g. the Mamba3 MIMO backward config tuned for R=4 (``chunk_rows=32``, 2 warps) is invalid
for R=16 (C = 32/16 = 2 steps, fewer than 4; and 64 rows need 4 warps' registers): served with
``chunk_rows=64, num_warps=4``. The answer is then ``nearest``, lists the changes (:attr:`Answer.repaired`)
and says so in a note. Only changes of parameters that the broken constraints read are tried when the check
is a :class:`ConstraintCheck` (server, client and ``tuner regret`` all use one), and the validity checks
spent on repairs are bounded per lookup (:data:`REPAIR_CHECKS`): a lookup miss stays well within a
millisecond or two.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tuner.distance import DEFAULT_DISTANCE, ShapeDistance
from tuner.expr import Expression, ExpressionError

Match = Literal["exact", "nearest", "default"]

# Another shape's entry is served only if its config beat the default on its own shape by this much (in the
# final round that published it): a tuned config within noise of the default there is no evidence for the
# requested shape (on the H200 stores, with the gate off, served configs lost up to 75% where the default lost
# less: benchmarks/regret.md, "The gain gate, varied").
MIN_GAIN = 0.05
# Up to this distance the lookup ranks and gates entries as it did when nothing farther was served (a cap at 3,
# until 2026-12-04). Beyond it: an entry ranks after every entry within it (whatever their device names or
# software; among themselves, far entries rank as near ones do), must have gained MIN_GAIN × distance /
# NEAR_DISTANCE over the default on its own shape (at 4.5, 7.5%; at 6, 10%), and is not served without a
# default figure (an older store or export file: no gain to weigh) unless there is no default config at all.
# A config's edge over the default fades with distance, so a far entry must carry more of it. Under the chunk
# cumsum's version 6, whose default loses 4.7-28% on every tuned shape, the cap served the default at +14% and
# +11% where the entries beyond it lost 3.5% and 0%; for the Triton template's 2p7b shape the entry 4.7 away
# (B=1,H=48,S=4096 fp16, 6.4% gain there) loses 31.5% and is still refused. benchmarks/regret.md, "The gain
# gate, varied", has the leave-one-out figures of 1.5 to 4 and of the flat gate.
NEAR_DISTANCE = 3.0

# Software fields that are compared whatever the backend; a backend's own library (``triton``, ``tilelang``)
# is compared for templates of that backend only.
COMMON_SOFTWARE = ("driver", "runtime", "torch", "torch_npu")
BACKEND_LIBRARIES = ("triton", "tilelang")
# The CUDA driver and runtime say nothing about another kind of device: not sent for those.
CUDA_ONLY_SOFTWARE = ("driver", "runtime")


def requester_software(device_kind: str, software: Mapping[str, str]) -> dict[str, str]:
    """The software a requester on a device of ``device_kind`` sends (the runtime client does, and ``tuner
    verify`` asks as a fully informed client would): the fields the lookup knows (:data:`COMMON_SOFTWARE`,
    :data:`BACKEND_LIBRARIES`) of ``software``, less the CUDA driver and runtime off CUDA. Pure."""
    return {k: v for k, v in software.items() if (k in COMMON_SOFTWARE or k in BACKEND_LIBRARIES)
            and (device_kind == "cuda" or k not in CUDA_ONLY_SOFTWARE)}


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
    # The template's default config in the final round that published this best (µs; None: not measured
    # there, or an export file older than this field): what the tuning gained on the entry's own shape.
    default_us: float | None = None

    @property
    def gain(self) -> float | None:
        """How much faster the best ran than the default on the entry's shape, in its round (default_us /
        median_us − 1; 0.0 when the best is the default), or None when unknown."""
        if self.default_us is None or not self.median_us:
            return None
        return self.default_us / self.median_us - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Entry:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def verification_summary(
    *, verified_at: str, median_us: float | None, stored_us: float, drift: float | None, tolerance: float,
    flagged: bool, processes: int, device_name: str, fingerprint_hash: str, wrong_processes: int = 0,
) -> dict[str, Any]:
    """The figures of a verification that answers carry (API, export file, client)."""
    return {"verified_at": verified_at, "median_us": median_us, "stored_us": stored_us, "drift": drift,
            "tolerance": tolerance, "flagged": flagged, "processes": processes, "device_name": device_name,
            "fingerprint": fingerprint_hash, "wrong_processes": wrong_processes}


def verification_note(summary: Mapping[str, Any]) -> str | None:
    """A note for an answer whose entry's latest verification is flagged, else None."""
    if not summary.get("flagged"):
        return None
    when = str(summary.get("verified_at", ""))[:19]
    if summary.get("wrong_processes"):
        return (f"verification of {when} on {summary.get('device_name')}: the config gave wrong results in "
                f"{summary['wrong_processes']} of {summary['processes']} fresh processes")
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
class ConfigChange:
    """One parameter of an entry's config changed by a repair: ``entry`` its value there, ``served`` the value
    served."""

    param: str
    entry: Any
    served: Any

    def __str__(self) -> str:
        return f"{self.param} {self.entry} → {self.served}"


@dataclass(frozen=True)
class Domain:
    """The values a config parameter may take (a search space parameter): what a repair chooses from.

    ``kind``: ``pow2`` and ``int`` are numeric (a change costs ``|log2|`` of the ratio, or the absolute
    difference where a value is not positive); ``categorical`` and ``bool`` changes cost 1."""

    name: str
    kind: str
    choices: tuple[Any, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "choices": list(self.choices)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Domain:
        return cls(str(data["name"]), str(data["kind"]), tuple(data["choices"]))

    def moves(self, value: Any, *, neighbours_only: bool = False) -> list[tuple[float, int, Any]]:
        """(cost, position, other value) for every other value of the domain, cheapest first (ties: domain
        order); ``neighbours_only``: for a numeric parameter, only the nearest value below and above."""
        numeric = self.kind in ("int", "pow2") and _is_number(value)
        found = []
        for i, choice in enumerate(self.choices):
            if choice == value and type(choice) is type(value):
                continue
            if numeric and _is_number(choice):
                cost = (abs(math.log2(choice / value)) if choice > 0 and value > 0 else float(abs(choice - value)))
            else:
                cost = 1.0
            found.append((cost, i, choice))
        found.sort(key=lambda m: (m[0], m[1]))
        if neighbours_only and numeric:
            below = [m for m in found if _is_number(m[2]) and m[2] < value][:1]
            above = [m for m in found if _is_number(m[2]) and m[2] > value][:1]
            found = sorted(below + above, key=lambda m: (m[0], m[1]))
        return found


# Validity checks a lookup may spend on repairs, all entries together (each costs 3–20 µs for the MIMO space).
REPAIR_CHECKS = 64

Valid = Callable[[Mapping[str, Any], Mapping[str, Any]], bool]


@dataclass(frozen=True)
class ConstraintCheck:
    """A template's constraints (:mod:`tuner.expr` expressions over the config's parameters and the shape's
    dims), as the server, the export-file client and the regret checker all evaluate them. Called with
    ``(config, shape)``: whether every constraint holds (a non-scalar value or a failing expression: no).
    :meth:`violated` also says which names the broken constraints read, so that a repair only changes
    parameters that can mend them (a constraint reading none of the changed parameters stays broken)."""

    expressions: tuple[Expression, ...]

    def __call__(self, config: Mapping[str, Any], shape: Mapping[str, Any]) -> bool:
        env = _env(config, shape)
        return env is not None and all(_holds(e, env) for e in self.expressions)

    def violated(self, config: Mapping[str, Any], shape: Mapping[str, Any]) -> list[frozenset[str]]:
        """The names each broken constraint reads (empty: valid); a malformed config breaks one reading all."""
        env = _env(config, shape)
        if env is None:
            return [frozenset(config)]
        return [e.names for e in self.expressions if not _holds(e, env)]


def _env(config: Mapping[str, Any], shape: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        env = {**shape, **config}
    except TypeError:
        return None
    return env if all(isinstance(v, int | float | str | bool) for v in env.values()) else None


def _holds(expression: Expression, env: Mapping[str, Any]) -> bool:
    try:
        return bool(expression.evaluate(env))
    except ExpressionError:
        return False


def repair_config(
    config: Mapping[str, Any],
    shape: Mapping[str, Any],
    domains: Sequence[Domain],
    valid: Valid,
    *,
    budget: list[int] | None = None,
) -> tuple[dict[str, Any], tuple[ConfigChange, ...]] | None:
    """The cheapest valid repair of ``config`` for ``shape`` (see the module docstring): the repaired config
    and its changes, or None when no change of one parameter, nor of two neighbouring values, is valid.

    ``budget``: a one-element list, the validity checks left (decremented; none left: None). Only
    parameters the config holds are changed; when ``valid`` is a :class:`ConstraintCheck`, only changes
    touching a parameter of every broken constraint are tried (the others cannot be valid: same answer,
    fewer checks). Never raises (``valid`` must not)."""
    left = budget if budget is not None else [REPAIR_CHECKS]
    present = [d for d in domains if d.name in config]
    broken = valid.violated(config, shape) if isinstance(valid, ConstraintCheck) else []

    def mends(*names: str) -> bool:
        return all(any(n in reads for n in names) for reads in broken)

    singles = sorted(((cost, p, i, d.name, v) for p, d in enumerate(present) if mends(d.name)
                      for cost, i, v in d.moves(config[d.name])), key=lambda m: m[:3])
    for _, _, _, name, value in singles:
        found = _try(config, shape, valid, left, ((name, value),))
        if found is not None or left[0] <= 0:
            return found
    near = [[(cost, i, d.name, v) for cost, i, v in d.moves(config[d.name], neighbours_only=True)] for d in present]
    pairs = sorted(((a[0] + b[0], p, a[1], q, b[1], a[2], a[3], b[2], b[3])
                    for p in range(len(present)) for q in range(p + 1, len(present))
                    if mends(present[p].name, present[q].name)
                    for a in near[p] for b in near[q]), key=lambda m: m[:5])
    for pair in pairs:
        found = _try(config, shape, valid, left, ((pair[5], pair[6]), (pair[7], pair[8])))
        if found is not None or left[0] <= 0:
            return found
    return None


def _try(config: Mapping[str, Any], shape: Mapping[str, Any], valid: Valid, left: list[int],
         changes: tuple[tuple[str, Any], ...]) -> tuple[dict[str, Any], tuple[ConfigChange, ...]] | None:
    if left[0] <= 0:
        return None
    left[0] -= 1
    candidate = {**config, **dict(changes)}
    if not valid(candidate, shape):
        return None
    return candidate, tuple(ConfigChange(name, config[name], value) for name, value in changes)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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
    repaired: tuple[ConfigChange, ...] = ()  # the entry's parameters changed to make its config valid here

    @property
    def foreign(self) -> bool:
        """Whether the entry was verified on another device name or software than the requester's."""
        return any(not d.what.startswith("shape.") and d.what != "template_version" for d in self.differences)


def served_notes(answer: Answer) -> tuple[str, ...]:
    """Every note an answer is served with — by ``GET /v1/best``, the offline client over an export file and
    ``tuner best --lookup`` alike: the lookup's own (:attr:`Answer.notes`), one per difference of device name,
    software or template version (the requested shape's own differences are in ``differences`` alone), and
    the entry's flagged verification (:func:`verification_note`). Pure."""
    notes = list(answer.notes)
    for d in answer.differences:
        if d.what == "device_name":
            notes.append(f"nothing measured on {d.requested!r}; this config was measured on {d.entry!r}")
        elif not d.what.startswith("shape."):
            notes.append(f"verified under another {d}")
    e = answer.entry
    drifted = verification_note(e.verification) if e is not None and e.verification else None
    if drifted:
        notes.append(drifted)
    return tuple(notes)


def answer_fields(answer: Answer, *, template: str, version: str, shape: Mapping[str, Any], shape_key: str,
                  device_kind: str | None) -> dict[str, Any]:
    """The fields of ``GET /v1/best``'s answer (``api/schemas.py`` BestOut) for ``answer``, as plain values:
    the API builds its model from them, ``tuner best`` prints them, so the two say the same. ``device_kind``:
    the kind asked for (the entry's when None). Pure."""
    e = answer.entry
    return {
        "template": template, "template_version": version, "shape": dict(shape), "shape_key": shape_key,
        "device_kind": device_kind if device_kind is not None else e.device_kind if e else None,
        "device_name": e.device_name if e else None, "match": answer.match, "distance": answer.distance,
        "config": dict(answer.config), "median_us": e.median_us if e else None, "p20_us": e.p20_us if e else None,
        "p80_us": e.p80_us if e else None, "n_samples": e.n_samples if e else None, "timer": e.timer if e else None,
        "measurement_id": e.measurement_id if e else None, "fingerprint": e.fingerprint_hash if e else None,
        "published_at": e.published_at if e else None, "source_shape": dict(e.shape) if e else None,
        "software": dict(e.software) if e and e.software is not None else None,
        "differences": [{"what": d.what, "requested": d.requested, "entry": d.entry} for d in answer.differences],
        "unchecked": list(answer.unchecked),
        "repaired": [{"param": c.param, "entry": c.entry, "served": c.served} for c in answer.repaired],
        "measured_version": e.template_version if e else None, "notes": list(served_notes(answer)),
        "verification": dict(e.verification) if e is not None and e.verification else None,
    }


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


def fit_distance(distance: ShapeDistance, entries: Sequence[Entry]) -> ShapeDistance:
    """``distance`` fitted to ``entries`` (:meth:`ShapeDistance.fitted`; itself when it learns nothing or is
    fitted already). One example per shape — its most recently published entry, ties by config — taken in
    shape order, so the weights do not depend on the order of ``entries``. The server and the export-file
    client fit once per set of entries and pass the result to :func:`choose`, which otherwise fits on every
    call. Pure; never raises for well-formed entries."""
    if not distance.learn:
        return distance
    return distance.fitted((e.shape, e.config) for e in latest_per_shape(entries))


def latest_per_shape(entries: Sequence[Entry]) -> list[Entry]:
    """One entry per shape of ``entries`` — its most recently published, ties by config — in shape order (the
    examples :func:`fit_distance` fits on; the warm starts' neighbours). Independent of the order of
    ``entries``. Pure."""
    latest: dict[str, Entry] = {}
    for e in sorted(entries, key=lambda e: (e.published_at or "", _key(e.config))):
        latest[_key(e.shape)] = e
    return [latest[k] for k in sorted(latest)]


def choose(
    shape: Mapping[str, Any],
    entries: Sequence[Entry],
    *,
    default: Mapping[str, Any] | None,
    valid: Callable[[Mapping[str, Any], Mapping[str, Any]], bool] | None = None,
    device_name: str | None = None,
    requester: Requester | None = None,
    distance: ShapeDistance = DEFAULT_DISTANCE,
    domains: Sequence[Domain] | None = None,
    min_gain: float = MIN_GAIN,
    near_distance: float = NEAR_DISTANCE,
    version: str | None = None,
) -> Answer | None:
    """Pick the config for ``shape`` among ``entries`` (already filtered to one template and device kind).

    Another shape's entry whose config beat the default on its own shape by less than :func:`required_gain`
    at its distance (``min_gain`` up to ``near_distance``, more beyond: :data:`MIN_GAIN`,
    :data:`NEAR_DISTANCE`; :attr:`Entry.gain`) is skipped, with a note: the default is then the better bet; so
    is one without a default figure farther than ``near_distance`` (when there is a ``default``), and entries
    that far rank after all entries within it. ValueError if ``near_distance`` is not positive.

    ``valid(config, shape)`` checks a config against the template's constraints for the requested shape;
    ``domains``: the parameters' domains, to repair an entry's invalid config (None: such entries are
    skipped); ``requester`` (or just ``device_name``) says who asks, see the module docstring. ``version``: the
    template version answered for; an entry of another version (one it carries,
    :class:`tuner.spec.CarriedVersion`) is noted as such, and ranks after an entry of ``version`` at the same
    distance (the requester's own device name and software still come first, even where they have only a carried
    entry). Returns None when there is neither a usable entry nor a default. Never raises for well-formed
    entries.
    """
    if not near_distance > 0:
        raise ValueError(f"near_distance must be positive, not {near_distance!r}")
    who = requester if requester is not None else Requester(device_name=device_name)
    software = who.compared_software()
    distance = fit_distance(distance, entries)

    far = {id(e): distance(shape, e.shape) for e in entries}  # each entry's distance, computed once

    def rank(e: Entry) -> tuple[bool, bool, bool, float, bool]:
        beyond = far[id(e)] > near_distance  # after every near entry, whatever its device or software
        other_device = who.device_name is not None and e.device_name != who.device_name
        other_software = any((e.software or {}).get(k) != v for k, v in software.items())
        carried = version is not None and e.template_version != version  # a carried version's, after ours
        return beyond, other_device, other_software, far[id(e)], carried

    # Two stable sorts: most recent first, then by rank, so that ties go to the most recent entry.
    recent_first = sorted(entries, key=lambda e: e.published_at or "", reverse=True)
    notes: list[str] = []
    too_far = apart = 0
    budget = [REPAIR_CHECKS]
    for e in sorted(recent_first, key=rank):
        d = far[id(e)]
        if math.isinf(d):
            apart += 1
            continue
        if d > distance.max_distance:
            too_far += 1
            continue
        config: Mapping[str, Any] = e.config
        gain = e.gain
        if d > 0 and default is not None and dict(config) != dict(default):
            needed = required_gain(d, min_gain, near_distance)
            if gain is not None and gain < needed:
                notes.append(f"skipped the entry for {_key(e.shape)}: its config ran only {100 * gain:+.1f}% faster "
                             f"than the default there (< {100 * needed:.3g}% asked at distance {d:.3g}: no evidence "
                             "it helps this shape)")
                continue
            if gain is None and d > near_distance:
                notes.append(f"skipped the entry for {_key(e.shape)}: {d:.3g} away and no default figure to say "
                             f"what its config gained there (served up to {near_distance:g} without one)")
                continue
        changes: tuple[ConfigChange, ...] = ()
        if valid is not None and not valid(e.config, shape):
            repaired = repair_config(e.config, shape, domains, valid, budget=budget) if domains else None
            if repaired is None:
                notes.append(f"skipped the entry for {_key(e.shape)}: its config is invalid for this shape")
                continue
            config, changes = repaired
            notes.append(f"repaired the config of the entry for {_key(e.shape)}, invalid for this shape: "
                         + ", ".join(map(str, changes)))
        if version is not None and e.template_version != version:
            notes.append(f"measured under template version {e.template_version}: version {version} has no best "
                         "of its own here yet")
        found = tuple(differences(shape, e, who))
        return Answer("nearest" if found or changes else "exact", dict(config), e, d, tuple(notes), found,
                      unchecked_fields(who), changes)
    if too_far:
        notes.append(f"{too_far} entr{'y' if too_far == 1 else 'ies'} farther than {distance.max_distance:g} "
                     f"not used (the distance {distance.name!r} serves nothing beyond it)")
    if apart:
        notes.append(f"{apart} entr{'y' if apart == 1 else 'ies'} of shapes not comparable with this one (they "
                     "differ in a dim that no config is served across, e.g. a dtype of another width)")
    if not entries:
        notes.append("no best config published for this template here yet: its default (a tuning job of this "
                     "shape publishes one)")
    if default is None:
        return None
    return Answer("default", dict(default), None, None, tuple(notes), (), unchecked_fields(who))


def required_gain(distance: float, min_gain: float = MIN_GAIN, near_distance: float = NEAR_DISTANCE) -> float:
    """The least gain over the default (:attr:`Entry.gain`) an entry at ``distance`` from the requested shape
    must have shown on its own shape to be served there: ``min_gain`` up to ``near_distance``, then growing in
    proportion to the distance (``near_distance`` inf: ``min_gain`` everywhere). Pure; ValueError if
    ``near_distance`` is not positive."""
    if not near_distance > 0:
        raise ValueError(f"near_distance must be positive, not {near_distance!r}")
    return min_gain * max(1.0, distance / near_distance)


def _key(shape: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={shape[k]}" for k in sorted(shape))
