"""``tuner rejudge``: the publishing rule of today replayed over a study's stored final rounds.

A final round publishes a config by a rule (:func:`tuner.driver.study.keep_served`: the config served before
the round stays unless the round's fastest is clearly faster than it). A rule that changes leaves the bests
that older rounds published by the old one: on the H200 store a best published on a 0.9% win (one step of
the timer) before the rule existed is now protected by it. :func:`replay` decides, from a study's stored
rounds alone, what the rule of today would serve: the rounds in the order they ran, each publishing as a
round publishes now — its OK template configs that no round or verification disproved and that a round of
today could publish (``admits``: still a valid config of the space for the shape, 3% under every error bound
on the round's inputs, :data:`tuner.driver.study.FINAL_NEAR_BOUND`), fastest first, the config served before
it kept unless the fastest beats it beyond noise. Before the first round that is the config the lookup
served the shape then: a carried version's best (``served``). Nothing is measured again: every figure is one
a round stored. :func:`rejudge` compares that with the study's published best and, when asked, publishes
the replay's config, its figures from the latest round it ran in, at the replaced best's publish time (the
lookup orders a shape's studies by that time: a re-judged study keeps its place among them), and only if
that best is still the one it read.

What the replay cannot know is left as the rounds left it: a round whose job was cancelled before it
published counts as having published, and its finalists are the ones the round ran (a round of today also
passes over trial rows short of the trial headroom when it picks them; the replay only judges what ran).

:func:`replay` and :func:`rounds_of` are pure; :func:`rejudge` and :func:`rejudge_template` read the store
and publish (one publish per changed study, when ``apply``), and raise StoreError.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from tuner.driver.study import FINAL_NEAR_BOUND, carried_best, keep_served, valid_or_repaired
from tuner.frozen import Config, Shape
from tuner.results import COMPARATOR_PREFIX, Status
from tuner.store import BestRecord, MeasurementRecord, StudyRecord, TuningStore
from tuner.store.entries import disproved_in
from tuner.template import KernelTemplate

# whether a stored round's OK row (and its config) is one a round of today could publish
Admits = Callable[[MeasurementRecord, Config], bool]


@dataclass(frozen=True)
class StoredEntry:
    """A final round's stored row as :func:`tuner.driver.study.keep_served` ranks it. Immutable."""

    row: MeasurementRecord
    config: Config

    @property
    def median_us(self) -> float:
        return self.row.median_us if self.row.median_us is not None else math.inf

    @property
    def p80_us(self) -> float:
        # as a running round's entry without figures: no win on an unknown spread
        return self.row.p80_us if self.row.p80_us is not None else math.inf


@dataclass(frozen=True)
class Replayed:
    """What the replay of one study's rounds serves: the config and, for it, the row of the latest round it
    ran OK in (the figures a publish copies); ``row`` is None when the config is the one served before the
    first round and no round measured it, both are None when nothing was served. ``rounds``: how many rounds
    were replayed; ``kept``: in how many a served config stayed over a faster one."""

    config: Config | None
    row: MeasurementRecord | None
    rounds: int
    kept: int


@dataclass(frozen=True)
class Rejudged:
    """One study: its published best when read (None: none), the replay, and the best this call published
    in its place (None: nothing published). ``changed``: the replay serves another config than that best."""

    study: StudyRecord
    best: BestRecord | None
    replayed: Replayed
    published: BestRecord | None = None

    @property
    def changed(self) -> bool:
        if self.best is None or self.replayed.row is None:
            return False  # nothing published (a study whose rounds published nothing stays so) or to publish
        return Config(self.best.config) != self.replayed.config

    @property
    def applied(self) -> bool:
        return self.published is not None


def rounds_of(finals: Sequence[MeasurementRecord]) -> list[list[MeasurementRecord]]:
    """A study's final-round rows grouped by round, the rounds in the order they ran (their first row's id),
    each round's rows by id. Pure."""
    grouped: dict[str, list[MeasurementRecord]] = {}
    for row in sorted(finals, key=lambda r: r.id):
        grouped.setdefault(row.round_id or f"row-{row.id}", []).append(row)
    return sorted(grouped.values(), key=lambda rows: rows[0].id)


def replay(rounds: Sequence[Sequence[MeasurementRecord]], disproved: Collection[Config], *,
           admits: Admits | None = None, served: Config | None = None) -> Replayed:
    """The rounds (:func:`rounds_of`) replayed under :func:`tuner.driver.study.keep_served`, starting from
    ``served`` (the config served before the first round; None: none), with ``disproved`` (configs found wrong
    by any round or verification, :func:`tuner.store.entries.disproved_in`) and every config of a row that
    ``admits`` refuses left out of every round: a round of today stores such a row WRONG_RESULT, which
    disproves its config for good, as ``disproved`` holds the rounds' own. Pure."""
    ranked = [[StoredEntry(r, Config(r.config)) for r in rows
               if r.status is Status.OK and r.median_us is not None and not r.candidate.startswith(COMPARATOR_PREFIX)]
              for rows in rounds]
    gone = set(disproved) | {e.config for entries in ranked for e in entries
                             if admits is not None and not admits(e.row, e.config)}
    kept = 0
    latest: dict[Config, MeasurementRecord] = {}
    for entries in ranked:
        publishable = sorted((e for e in entries if e.config not in gone), key=lambda e: (e.median_us, e.row.id))
        for e in publishable:
            latest[e.config] = e.row
        if not publishable:
            continue
        winner = keep_served(publishable, served)[0]
        kept += winner is not publishable[0]
        served = winner.config
    return Replayed(served, latest.get(served) if served is not None else None, len(rounds), kept)


def rejudge(store: TuningStore, study: StudyRecord, *, admits: Admits | None = None, served: Config | None = None,
            apply: bool = False, best: BestRecord | None = None) -> Rejudged:
    """:func:`replay` of the study's stored rounds (``admits``, ``served``: as there) against its published
    best; with ``apply``, a changed best is replaced by the replay's
    (:meth:`tuner.store.TuningStore.publish_unless_disproved`, stamped with the replaced best's time, and only
    while that best is still the study's: a final round or a verification that published meanwhile is not
    overwritten, nor is a config disproved since the read published). A study without a published best is
    left so. ``best``: the study's best when the caller has just read it (default: read here). Raises
    StoreError."""
    best = store.get_study_best(study_id=study.id) if best is None else best
    finals = store.list_measurements(study_id=study.id, role="final")
    found = Rejudged(study, best, replay(rounds_of(finals), disproved_in(store, study.id), admits=admits,
                                        served=served))
    if not (apply and found.changed and found.replayed.row is not None and best is not None):
        return found
    published = store.publish_unless_disproved(study_id=study.id, measurement_id=found.replayed.row.id,
                                               published_at=best.published_at, replacing=best.measurement_id)
    return Rejudged(study, best, found.replayed, published)


def rejudge_template(store: TuningStore, template: KernelTemplate, *, device_kind: str | None = None,
                     shape_keys: Collection[str] | None = None, apply: bool = False) -> list[Rejudged]:
    """:func:`rejudge` of every study of ``template``'s registered version (of ``device_kind`` and
    ``shape_keys`` when given) that has a published best, oldest study first, each replayed as a round of
    today runs: rows of configs no longer valid for the shape, or short of the final round's headroom under
    an error bound, are left out, and the config served before the first round is the carried version's
    best the lookup served the shape (completed and repaired as the lookup does). Raises StoreError."""
    space = template.space()
    carries = template.spec.carries
    bests = store.list_best(template=template.name, device_kind=device_kind)
    best_of = {b.study_id: b for b in bests}  # one best per study
    studies = [s for s in store.list_studies(template=template.name, device_kind=device_kind)
               if s.template_version == template.version and s.id in best_of
               and (shape_keys is None or s.shape_key in shape_keys)]
    found = []
    for study in studies:
        shape = Shape.from_json(study.shape_json)
        bounds = template.error_bounds(shape)

        def admits(row: MeasurementRecord, config: Config, shape: Shape = shape,
                   bounds: dict[str, float] = bounds) -> bool:
            return (space.in_domain(config) and space.is_valid(config, shape)
                    and FINAL_NEAR_BOUND.short_of(row.errors, bounds) is None)

        here = [b for b in bests if b.device_kind == study.device_kind and b.device_name == study.device_name]
        raw = None if _served_own_version_first(store, study, studies, here) else carried_best(
            here, study.shape_key, carries)
        served = None if raw is None else valid_or_repaired(space, shape.to_dict(), raw)
        found.append(rejudge(store, study, admits=admits, served=served, apply=apply, best=best_of[study.id]))
    return found


def _served_own_version_first(store: TuningStore, study: StudyRecord, studies: Sequence[StudyRecord],
                              here: Sequence[BestRecord]) -> bool:
    """Whether another study of the same version, shape and device (another fingerprint's) with a published
    best ran a final round before this study's first: the lookup then served the version's own best and a
    round carried nothing (:func:`tuner.driver.study.carried_config`). One read per such study."""
    others = [s for s in studies if s.id != study.id and s.shape_key == study.shape_key
              and s.device_kind == study.device_kind and s.device_name == study.device_name
              and any(b.study_id == s.id for b in here)]
    if not others:
        return False
    first = store.list_measurements(study_id=study.id, role="final", limit=1)
    if not first:
        return True  # no round of its own: nothing to replay either way
    for other in others:
        before = store.list_measurements(study_id=other.id, role="final", limit=1)
        if before and before[0].created_at < first[0].created_at:
            return True
    return False
