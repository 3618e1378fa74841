"""The store's published best configs as lookup entries, each with the fingerprint it was verified under.

One function shared by ``GET /v1/best``, the export file and ``tuner regret``, so that all three see the
same entries. A best config is published from a study, and a study's key holds the fingerprint of the
workers that measured (and verified) it: :attr:`tuner.lookup.Entry.software` is that fingerprint's driver,
runtime and library versions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tuner.distance import DEFAULT_DISTANCE, ShapeDistance
from tuner.frozen import Config
from tuner.keys import software_of
from tuner.lookup import Answer, Entry, Requester, choose, fit_distance, verification_summary
from tuner.results import COMPARATOR_PREFIX, Status
from tuner.spec import CarriedVersion
from tuner.store import BestRecord, TuningStore, VerificationRecord

if TYPE_CHECKING:
    from tuner.frozen import Shape
    from tuner.space import SearchSpace


def as_entry(
    record: BestRecord, software: Mapping[str, str] | None = None, check: VerificationRecord | None = None,
    default_us: float | None = None,
) -> Entry:
    """A stored best config (with its latest verification, if any, and the default's figure in its round) as
    a lookup entry (the export file holds the same dicts)."""
    return Entry(
        template=record.template, template_version=record.template_version, shape=record.shape,
        device_kind=record.device_kind, device_name=record.device_name, config=record.config,
        median_us=record.median_us, p20_us=record.p20_us, p80_us=record.p80_us, n_samples=record.n_samples,
        timer=record.timer, fingerprint_hash=record.fingerprint_hash, measurement_id=record.measurement_id,
        published_at=record.published_at.isoformat(), software=dict(software) if software is not None else None,
        verification=None if check is None else summary_of(check), default_us=default_us,
    )


def summary_of(check: VerificationRecord) -> dict[str, Any]:
    """A stored verification's :func:`tuner.lookup.verification_summary`: the figures answers carry (an
    entry's latest verification, a verify task's)."""
    return verification_summary(
        verified_at=check.created_at.isoformat(), median_us=check.median_us, stored_us=check.stored_us,
        drift=check.drift, tolerance=check.tolerance, flagged=check.flagged, processes=check.processes,
        device_name=check.device_name, fingerprint_hash=check.fingerprint_hash, wrong_processes=check.wrong_processes,
    )


def published_entries(
    store: TuningStore, *, template: str, device_kind: str | None = None, version: str | None = None,
    versions: Collection[str] | None = None,
) -> list[tuple[BestRecord, Entry]]:
    """The published best configs of ``template`` (of ``version``, or of ``versions``, and ``device_kind``
    when given), with their entries, newest first per key. Raises StoreError."""
    wanted = {version} if version is not None else None if versions is None else set(versions)
    records = [r for r in store.list_best(template=template, device_kind=device_kind)
               if wanted is None or r.template_version in wanted]
    studies = {s.id: s for s in store.list_studies(template=template, device_kind=device_kind)}
    checks = store.latest_verifications(study_ids=[r.study_id for r in records])
    defaults = store.round_defaults(measurement_ids=[r.measurement_id for r in records])
    found = []
    for r in records:
        study = studies.get(r.study_id)
        software = software_of(study.fingerprint_json) if study is not None else None
        check = checks.get(r.study_id)
        found.append((r, as_entry(r, software, check.of_config(r.config_json) if check else None,
                                  defaults.get(r.measurement_id))))
    return found


def served_entries(
    store: TuningStore, *, template: str, version: str, carries: Sequence[CarriedVersion] = (),
    device_kind: str | None = None, admits: Callable[[Mapping[str, Any]], bool] | None = None,
) -> list[tuple[BestRecord, Entry]]:
    """What the lookup serves of ``template`` at ``version`` (``GET /v1/best``, the export file): its
    :func:`published_entries`, then, for every (device kind, device name, shape) without one of those, the
    entries of the first version of ``carries`` that has one there, their configs completed as this version
    needs (:meth:`tuner.spec.CarriedVersion.config`; each keeps its own ``template_version`` and figures).
    ``admits`` (e.g. :meth:`tuner.space.SearchSpace.in_domain`): a completed config it refuses (a parameter
    the current version dropped, a value outside a narrowed domain) is left out, the place stays open for the
    next carried version. The same reads as :func:`published_entries`. Raises StoreError."""
    found = published_entries(store, template=template, device_kind=device_kind,
                              versions={version, *(c.version for c in carries)})
    served = [(r, e) for r, e in found if r.template_version == version]
    covered = {(r.device_kind, r.device_name, r.shape_key) for r, _ in served}
    for carried in carries:
        taken = set()
        for r, e in found:
            where = (r.device_kind, r.device_name, r.shape_key)
            if r.template_version == carried.version and where not in covered:
                config = carried.config(e.config)
                if admits is None or admits(config):
                    served.append((r, dataclasses.replace(e, config=config)))
                    taken.add(where)
        covered |= taken
    return served


def exact_answer(
    store: TuningStore, *, template: str, version: str, carries: Sequence[CarriedVersion], space: SearchSpace,
    shape: Shape, device_kind: str | None = None,
) -> Answer | None:
    """The config served for exactly ``shape`` (``tuner best``; ``GET /v1/best`` when the shape has an entry of
    its own): among :func:`served_entries` of that shape (configs outside ``space``'s domains left out), the
    lookup's choice (the requester's device first, this version before a carried one, a config the current
    constraints reject repaired). None when the store serves nothing for the shape itself (no nearest shape, no
    default). Raises StoreError."""
    key = shape.key()
    here = [e for r, e in served_entries(store, template=template, version=version, carries=carries,
                                         device_kind=device_kind, admits=space.in_domain) if r.shape_key == key]
    if not here:
        return None
    answer = choose(shape.to_dict(), here, default=None, valid=space.constraint_check, domains=space.domains,
                    version=version)
    return answer if answer is not None and answer.entry is not None else None


def lookup_answer(
    entries: Sequence[Entry], *, shape: Shape, space: SearchSpace, version: str, requester: Requester,
    distance: ShapeDistance | None = None,
) -> Answer:
    """What ``GET /v1/best`` (and ``tuner best --lookup``) answers for ``shape`` among ``entries`` (the
    :func:`served_entries` of one template and device kind): :func:`tuner.lookup.choose` with the search
    space's default as the last resort, its constraints (an invalid config repaired within its domains) and
    ``distance`` (the lookup's, fitted over ``entries``: pass it when it is cached). Pure; never raises for
    well-formed entries."""
    fitted = distance if distance is not None else fit_distance(DEFAULT_DISTANCE, entries)
    answer = choose(shape.to_dict(), entries, default=space.default.to_dict(), requester=requester,
                    valid=space.constraint_check, domains=space.domains, distance=fitted, version=version)
    assert answer is not None, "a search space always has a default"
    return answer


def disproved_in(store: TuningStore, study_id: int) -> set[Config]:
    """Configs a final round or a verification of the study found wrong (WRONG_RESULT on their inputs): right
    on their trial's inputs and wrong on others, over an error bound, or, in a final round, within the headroom
    it asks under one (:data:`tuner.driver.study.FINAL_NEAR_BOUND`). Final rounds leave them out, a
    verification replaces a published one (:func:`tuner.driver.reverify.verify_best`), the report and the
    pages do not show one as the best (:func:`round_winner`). A crash or a build error is left out: it may be
    the host's, not the config's; so is a verification on another device name than the study's (another
    GPU's numerics say nothing about the study's own clients). One read
    (:meth:`tuner.store.TuningStore.disproved_configs`); :func:`disproved_by_study` for several studies.
    Raises StoreError."""
    return disproved_by_study(store, [study_id])[study_id]


def disproved_by_study(store: TuningStore, study_ids: Sequence[int]) -> dict[int, set[Config]]:
    """:func:`disproved_in` of each of these studies (an empty set for one without any), in one read: the
    pages and the report show many studies at once. Raises StoreError."""
    found = store.disproved_configs(study_ids=study_ids)
    return {i: {Config.from_json(c) for c in found.get(i, ())} for i in study_ids}


class RoundRow(Protocol):
    """A final round's entry, as the store's records and the pages' aggregate reads carry it."""

    @property
    def candidate(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def median_us(self) -> float | None: ...
    @property
    def config_json(self) -> str: ...


R = TypeVar("R", bound=RoundRow)


def round_winner(final: Sequence[R], disproved: Collection[Config] = frozenset(),
                 published: Config | None = None) -> R | None:
    """The best a final round shows: the ``published`` config (the study's best now) when it ran OK in the
    round and nothing disproved it — a round keeps the config served before it unless the fastest beats it
    clearly (:func:`tuner.driver.study.keep_served`) —, else its fastest OK template config (comparators are
    not configs of the template) that no round or verification disproved (:func:`disproved_in`); the first in
    ``final``'s order among equal times. The report, the pages and ``/v1/studies/{id}`` all show this one."""
    measured = [(m, Config.from_json(m.config_json)) for m in final if m.status == Status.OK
                and m.median_us is not None and not m.candidate.startswith(COMPARATOR_PREFIX)]
    ok = [(m, c) for m, c in measured if c not in disproved]
    kept = next((m for m, c in ok if c == published), None) if published is not None else None
    return kept if kept is not None else min((m for m, _ in ok), key=lambda m: m.median_us or math.inf, default=None)
