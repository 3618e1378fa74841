"""store.study_outcomes, the template page's aggregate read: each study's latest final round (by id, not the
older rounds), its measured trials (INVALID left out) and failures, and its search time; on SQLite and
PostgreSQL."""

from __future__ import annotations

from tests.fixtures.studies import study_fields
from tuner import db
from tuner.store import NewMeasurement


def _add(store: db.Store, study_id: int, role: str, candidate: str, status: str, us: float | None,
         round_id: str | None = None, n: int | None = None) -> None:
    store.record_measurement(NewMeasurement(
        study_id=study_id, role=role, candidate=candidate, config_json={"BLOCK_H": 4}, status=status,
        median_us=us, p20_us=us and us - 0.1, p80_us=us and us + 0.1, round_id=round_id, trial_number=n))


def test_outcomes_read_the_latest_round_and_count_trials(db_url: str) -> None:
    store = db.Store.open(db_url)
    try:
        a = store.get_or_create_study(**study_fields())
        b = store.get_or_create_study(**study_fields(S=2048))
        for n, status in enumerate(["OK", "OK", "INVALID", "RUNTIME_ERROR"]):
            _add(store, a.id, "trial", "config", status, 5.0 if status == "OK" else None, n=n)
        _add(store, a.id, "final", "config", "OK", 9.0, "old")
        _add(store, a.id, "final", "config", "OK", 3.0, "new")
        _add(store, a.id, "final", "comparator:x", "OK", 4.0, "new")
        _add(store, b.id, "trial", "config", "OK", 1.0, n=0)

        outcomes = store.study_outcomes(study_ids=[a.id, b.id, 9999])
        assert set(outcomes) == {a.id, b.id}
        got = outcomes[a.id]
        assert [(e.candidate, e.median_us) for e in got.final] == [("config", 3.0), ("comparator:x", 4.0)]
        assert got.final[0].p20_us == 2.9 and got.final[0].config_json == '{"BLOCK_H":4}'
        assert (got.trials, got.failed) == (3, 1)
        assert got.search_s is not None and 0 <= got.search_s < 60
        assert outcomes[b.id].final == () and (outcomes[b.id].trials, outcomes[b.id].failed) == (1, 0)
        assert outcomes[b.id].search_s is None
        assert store.study_outcomes(study_ids=[]) == {}
    finally:
        store.close()


def test_outcomes_show_the_round_that_published_the_best_not_a_later_one_that_did_not(db_url: str) -> None:
    """A job cancelled while its final round ran leaves a later round that published nothing: the template
    page showed its figures beside a lookup serving the published round's config."""
    store = db.Store.open(db_url)
    try:
        a = store.get_or_create_study(**study_fields())
        _add(store, a.id, "final", "config", "OK", 6.0, "published")
        (published,) = store.list_measurements(study_id=a.id, role="final", round_id="published")
        store.publish_best(study_id=a.id, measurement_id=published.id)
        _add(store, a.id, "final", "config", "OK", 4.0, "cancelled")
        assert [e.median_us for e in store.study_outcomes(study_ids=[a.id])[a.id].final] == [6.0]
        _add(store, a.id, "final", "config", "OK", 5.0, "next")
        (newer,) = store.list_measurements(study_id=a.id, role="final", round_id="next")
        store.publish_best(study_id=a.id, measurement_id=newer.id)  # a later round that did publish
        assert [e.median_us for e in store.study_outcomes(study_ids=[a.id])[a.id].final] == [5.0]
    finally:
        store.close()
