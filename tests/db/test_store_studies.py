"""Studies: get-or-create (also racing threads and processes), lookups, key conflicts."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import timezone

import pytest
from sqlalchemy import func, select

from tests.fixtures.studies import open_and_create_study, study_fields
from tuner.db import RecordConflictError, Store, StudyRecord, get_or_create_study, get_study, list_studies
from tuner.db.models import StudyRow


def count_studies(store: Store) -> int:
    with store.session(readonly=True) as session:
        return int(session.scalar(select(func.count(StudyRow.id))) or 0)


def test_get_or_create_returns_the_stored_study(store: Store) -> None:
    fields = study_fields()
    with store.session() as session:
        created = get_or_create_study(session, **fields)
    with store.session() as session:
        again = get_or_create_study(session, **fields)
        by_name = get_study(session, name=fields["name"])
        by_id = get_study(session, study_id=created.id)
    assert created == again == by_name == by_id
    assert created.name == fields["name"]
    assert created.shape == {"B": 1, "H": 48, "S": 4096, "dtype": "fp16"}
    assert json.loads(created.fingerprint_json) == json.loads(fields["fingerprint_json"])
    assert created.created_at.tzinfo is timezone.utc
    assert count_studies(store) == 1


def test_missing_studies_are_none_and_lookups_need_one_key(store: Store) -> None:
    with store.session(readonly=True) as session:
        assert get_study(session, name="nope") is None
        assert get_study(session, study_id=12345) is None
        with pytest.raises(ValueError):
            get_study(session)
        with pytest.raises(ValueError):
            get_study(session, name="a", study_id=1)


def test_json_is_stored_canonically_and_invalid_json_refused(store: Store) -> None:
    fields = study_fields()
    fields["shape_json"] = '{ "S": 4096, "B": 1 }'
    with store.session() as session:
        assert get_or_create_study(session, **fields).shape_json == '{"B":1,"S":4096}'
    with pytest.raises(ValueError, match="shape_json"), store.session() as session:
        get_or_create_study(session, **{**study_fields(S=8), "shape_json": "{not json"})
    assert count_studies(store) == 1


def test_a_name_stored_with_another_key_is_a_conflict(store: Store) -> None:
    fields = study_fields()
    with store.session() as session:
        get_or_create_study(session, **fields)
    with pytest.raises(RecordConflictError, match="fingerprint_hash"), store.session() as session:
        get_or_create_study(session, **{**fields, "fingerprint_hash": "000000000000"})
    with pytest.raises(RecordConflictError, match="already stored under"), store.session() as session:
        get_or_create_study(session, **{**fields, "name": "another name"})
    assert count_studies(store) == 1


def test_list_studies_filters_by_template_and_device_kind(store: Store) -> None:
    with store.session() as session:
        a = get_or_create_study(session, **study_fields())
        b = get_or_create_study(session, **study_fields(S=8192))
        c = get_or_create_study(session, **study_fields(template="mamba3_mimo_bwd"))
    with store.session(readonly=True) as session:
        assert list_studies(session) == [a, b, c]
        assert list_studies(session, template="mamba2_chunk_cumsum") == [a, b]
        assert list_studies(session, device_kind="cuda", template="mamba3_mimo_bwd") == [c]
        assert list_studies(session, device_kind="npu") == []


def test_a_creator_blocked_behind_an_uncommitted_one_gets_the_same_row(store: Store) -> None:
    # PostgreSQL: B's INSERT waits on A's uncommitted unique key, fails once A commits, and B reads
    # A's row after rolling back its savepoint. SQLite: B's BEGIN IMMEDIATE waits for A's commit.
    fields = study_fields()
    results: list[StudyRecord | BaseException] = []

    def create_b() -> None:
        try:
            with store.session() as session:
                results.append(get_or_create_study(session, **fields))
        except BaseException as exc:  # reported below
            results.append(exc)

    with store.session() as session:
        created = get_or_create_study(session, **fields)
        thread = threading.Thread(target=create_b)
        thread.start()
        time.sleep(0.5)  # let B reach its INSERT (PostgreSQL) or its BEGIN (SQLite)
        assert results == []  # B is still waiting for A
    thread.join(timeout=30)
    assert results == [created]
    assert count_studies(store) == 1


def test_racing_threads_end_with_one_study(store: Store) -> None:
    fields = study_fields()
    barrier = threading.Barrier(4)
    results: list[int | BaseException] = []

    def create() -> None:
        barrier.wait()
        try:
            with store.session() as session:
                results.append(get_or_create_study(session, **fields).id)
        except BaseException as exc:  # reported below
            results.append(exc)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and len(set(results)) == 1, results
    assert count_studies(store) == 1


@pytest.mark.slow
def test_processes_migrating_a_fresh_database_and_creating_one_study(db_url: str) -> None:
    # Each process migrates (serialised by the database's lock) then creates the same study.
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=spawn) as pool:
        ids = list(pool.map(open_and_create_study, [db_url] * 2))
    assert len(set(ids)) == 1
    with Store.open(db_url) as store:
        assert count_studies(store) == 1


def test_store_errors_inside_get_or_create_are_translated(store: Store) -> None:
    # A NULL in a NOT NULL column is the caller's data (RecordConflictError, 409), not an outage (StoreError).
    with pytest.raises(RecordConflictError), store.session() as session:
        get_or_create_study(session, **{**study_fields(), "template": None})


def test_studies_by_activity_put_the_latest_measured_first(store: Store) -> None:
    """The overview's "recently active" list: an old study measured again comes first, not only the newest
    studies sorted among themselves."""
    from tuner.db import add_measurement

    with store.session() as session:
        ids = [get_or_create_study(session, **study_fields(B=b)).id for b in range(1, 15)]
    for study_id in ids[1:]:
        with store.session() as session:
            add_measurement(session, study_id=study_id, role="trial", candidate="config", config_json='{"a":1}',
                            status="OK", median_us=1.0, trial_number=0)
    time.sleep(0.01)
    with store.session() as session:  # the oldest study, measured last
        add_measurement(session, study_id=ids[0], role="trial", candidate="config", config_json='{"a":2}',
                        status="OK", median_us=1.0, trial_number=1)
    newest, total = store.list_study_summaries(limit=12)
    assert total == 14 and ids[0] not in [s.study.id for s in newest]
    active, _ = store.list_study_summaries(limit=12, by_activity=True)
    order = [s.study.id for s in active]
    assert order[0] == ids[0]
    assert order[1:] == sorted(ids[1:], reverse=True)[:11]  # then by their own activity


def test_studies_by_activity_probe_each_studys_newest_measurement_through_an_index(store: Store) -> None:
    """The overview polls this list every 3 s per open page: it read each study's newest measurement by
    grouping the whole measurements table (a cost that grew with all history, not with the page). Now the
    database's own plan finds it by a probe of the (study_id, created_at) index, study by study."""
    from sqlalchemy import event

    from tuner.db import add_measurement

    with store.session() as session:
        ids = [get_or_create_study(session, **study_fields(B=b)).id for b in range(1, 4)]
        for k, study_id in enumerate(ids * 5):
            add_measurement(session, study_id=study_id, role="trial", candidate="config",
                            config_json=json.dumps({"a": k}), status="OK", median_us=1.0, trial_number=k)
    sent: list[tuple[str, object]] = []

    def keep(conn: object, cursor: object, statement: str, parameters: object, *args: object) -> None:
        if "coalesce" in statement.lower():
            sent.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", keep)
    try:
        active, _ = store.list_study_summaries(limit=2, by_activity=True)
    finally:
        event.remove(store.engine, "before_cursor_execute", keep)
    assert [s.study.id for s in active] == ids[::-1][:2]
    ((statement, parameters),) = sent
    raw = store.engine.raw_connection()
    try:
        cursor = raw.cursor()
        if store.dialect == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + statement, parameters)
            plan = " / ".join(str(row[-1]) for row in cursor.fetchall())
            assert "ix_tuner_measurements_study_created (study_id=?)" in plan, plan
            assert "SCAN tuner_measurements" not in plan, plan
        else:
            cursor.execute("SET enable_seqscan = off")  # a table this small is read whole whatever its indexes
            cursor.execute("EXPLAIN " + statement, parameters)
            plan = " / ".join(str(row[0]) for row in cursor.fetchall())
            assert "using ix_tuner_measurements_study_created" in plan, plan
            assert "Index Cond: ((study_id = tuner_studies.id)" in plan and "GroupAggregate" not in plan, plan
    finally:
        raw.rollback()
        raw.close()
