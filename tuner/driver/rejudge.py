"""``tuner rejudge``: the publishing rule of today replayed over a study's stored final rounds.

A final round publishes a config by a rule (:func:`tuner.driver.study.keep_served`: the config served before
the round stays unless the round's fastest is clearly faster than it). A rule that changes leaves the bests
that older rounds published by the old one: on the H200 store a best published on a 0.9% win (one step of
the timer) before the rule existed is now protected by it. :func:`replay` decides, from a study's stored
rounds alone, what the rule of today would serve: the rounds in the order they ran, each publishing as a
round publishes now (its OK template configs that no round or verification disproved, fastest first, the
config the replay served before it kept unless the fastest beats it beyond noise). Nothing is measured
again: every figure is one the round stored. :func:`rejudge` compares that with the study's published best
and, when asked, publishes the replay's config, its figures from the latest round it ran OK in, at the
replaced best's publish time (the lookup orders a shape's studies by that time: a re-judged study keeps its
place among them).

What the replay cannot know is left as the rounds left it: the first round of a study publishes its fastest
(the carried config a round of today measures beside it as the served one was not labelled so), and a round
whose job was cancelled before it published counts as having published.

Pure, but for :func:`rejudge` and :func:`rejudge_template` (the store's reads, and a publish per changed study
when ``apply``), which raise StoreError.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tuner.driver.study import keep_served
from tuner.frozen import Config
from tuner.results import COMPARATOR_PREFIX, Status
from tuner.store import BestRecord, MeasurementRecord, StudyRecord, TuningStore
from tuner.store.entries import disproved_in


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
        # a row without its p80 is judged on its median: a win by any margin
        return self.row.p80_us if self.row.p80_us is not None else self.median_us


@dataclass(frozen=True)
class Replayed:
    """What the replay of one study's rounds serves: the config and, for it, the row of the latest round it
    ran OK in (the figures a publish copies); both None when no round had a publishable config. ``rounds``:
    how many rounds were replayed; ``kept``: in how many a served config stayed over a faster one."""

    config: Config | None
    row: MeasurementRecord | None
    rounds: int
    kept: int


@dataclass(frozen=True)
class Rejudged:
    """One study: its published best (None: none), the replay, and whether the replay's config was
    published by this call. ``changed``: the replay serves another config than the published best."""

    study: StudyRecord
    best: BestRecord | None
    replayed: Replayed
    applied: bool = False

    @property
    def changed(self) -> bool:
        if self.best is None or self.replayed.config is None:
            return False  # nothing published (a study whose rounds published nothing stays so) or to publish
        return Config(self.best.config) != self.replayed.config


def rounds_of(finals: Sequence[MeasurementRecord]) -> list[list[MeasurementRecord]]:
    """A study's final-round rows grouped by round, the rounds in the order they ran (their first row's id),
    each round's rows by id. Pure."""
    grouped: dict[str, list[MeasurementRecord]] = {}
    for row in sorted(finals, key=lambda r: r.id):
        grouped.setdefault(row.round_id or f"row-{row.id}", []).append(row)
    return sorted(grouped.values(), key=lambda rows: rows[0].id)


def replay(rounds: Sequence[Sequence[MeasurementRecord]], disproved: Collection[Config]) -> Replayed:
    """The rounds (:func:`rounds_of`) replayed under :func:`tuner.driver.study.keep_served`, ``disproved``
    (configs found wrong by any round or verification, :func:`tuner.store.entries.disproved_in`) left out of
    every round. Pure."""
    served: Config | None = None
    kept = 0
    latest: dict[Config, MeasurementRecord] = {}
    for rows in rounds:
        entries = [StoredEntry(r, Config(r.config)) for r in rows
                   if r.status is Status.OK and r.median_us is not None
                   and not r.candidate.startswith(COMPARATOR_PREFIX)]
        publishable = sorted((e for e in entries if e.config not in disproved), key=lambda e: (e.median_us, e.row.id))
        for e in publishable:
            latest[e.config] = e.row
        if not publishable:
            continue
        winner = keep_served(publishable, served)[0]
        kept += winner is not publishable[0]
        served = winner.config
    return Replayed(served, latest.get(served) if served is not None else None, len(rounds), kept)


def rejudge(store: TuningStore, study: StudyRecord, *, apply: bool = False) -> Rejudged:
    """:func:`replay` of the study's stored rounds against its published best; with ``apply``, a changed
    best is replaced by the replay's (:meth:`tuner.store.TuningStore.publish_unless_disproved`, stamped with
    the replaced best's time; a config disproved since the read is not published and ``applied`` stays
    False). A study without a published best is left so. Raises StoreError."""
    best = store.get_study_best(study_id=study.id)
    finals = store.list_measurements(study_id=study.id, role="final")
    found = Rejudged(study, best, replay(rounds_of(finals), disproved_in(store, study.id)))
    if not (apply and found.changed and found.replayed.row is not None and best is not None):
        return found
    published = store.publish_unless_disproved(study_id=study.id, measurement_id=found.replayed.row.id,
                                               published_at=best.published_at)
    return Rejudged(study, published or best, found.replayed, applied=published is not None)


def rejudge_template(store: TuningStore, template: str, *, device_kind: str | None = None,
                     version: str | None = None, shape_keys: Collection[str] | None = None,
                     apply: bool = False) -> list[Rejudged]:
    """:func:`rejudge` of every study of ``template`` (of ``version``, ``device_kind`` and ``shape_keys``
    when given) that has a published best, oldest study first. Raises StoreError."""
    published = {b.study_id for b in store.list_best(template=template, device_kind=device_kind)}
    studies = store.list_studies(template=template, device_kind=device_kind)
    return [rejudge(store, study, apply=apply) for study in studies
            if study.id in published and (version is None or study.template_version == version)
            and (shape_keys is None or study.shape_key in shape_keys)]
