"""Migrations down and up again with data, through the store's own engine (on SQLite: foreign keys on)."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text

from tuner.db import Store
from tuner.db.migrate import current_revision, head_revision, migrate_to, schema_drift
from tuner.errors import RecordConflictError


def _rows(store: Store) -> dict[str, list[tuple[object, ...]]]:
    queries = {
        "jobs": "SELECT id, state, kind, processes FROM tuner_jobs ORDER BY id",
        "tasks": "SELECT id, job_id, state, trials_reserved FROM tuner_tasks ORDER BY id",
        "slots": "SELECT id, task_id, worker_id, state FROM tuner_slots ORDER BY id",
        "workers": "SELECT id, state, current_task_id FROM tuner_workers ORDER BY id",
    }
    with store.engine.connect() as conn:
        return {name: [tuple(r) for r in conn.execute(text(q))] for name, q in queries.items()}


def _fill(store: Store) -> int:
    """A running job whose task has two reserved slots of a busy worker and one worker's attempt, and a queued
    verify job whose comparators run in its first process only."""
    job = store.create_job(
        template="t",
        template_version="1",
        backend="triton",
        device_kind="cpu",
        device_name=None,
        trials=4,
        sampler="tpe",
        samples=3,
        candidate_timeout_s=10.0,
        tasks=[("n=1", "n=1", '{"n": 1}')],
    )
    for worker_id in ("busy", "gave-up"):
        store.register_worker(
            worker_id=worker_id,
            host="h",
            pid=1,
            device_kind="cpu",
            device_name="CPU",
            device_index=0,
            backends=["triton"],
            fingerprint_hash="f",
            fingerprint_json="{}",
            lease_s=600.0,
            templates={"t": "1"},
        )
    claim = store.claim_task(worker_id="gave-up", device_kind="cpu", device_name="CPU", backends=["triton"])
    assert claim is not None
    store.fail_attempt(task_id=claim.task.id, worker_id="gave-up", reason="DeviceError: gone")
    assert store.claim_task(worker_id="busy", device_kind="cpu", device_name="CPU", backends=["triton"])
    for _ in range(2):
        assert store.reserve_slot(task_id=claim.task.id, worker_id="busy") is not None
    verify = store.create_verify_job(template="t", template_version="1", backend="triton", device_kind="cpu",
                                     device_name=None, tasks=[("n=2", "n=2", '{"n": 2}')], processes=2,
                                     comparator_processes=1, max_attempts=2)
    assert store.get_job(job_id=verify.id).comparator_processes == 1  # type: ignore[union-attr]
    return job.tasks[0].id


def _comparator_processes(store: Store) -> list[int | None]:
    return [j.comparator_processes for j in reversed(store.list_jobs())]


def test_down_to_0005_and_up_again_keeps_every_row(db_url: str) -> None:
    """0008, 0007 and 0006 rebuild tuner_jobs, tuner_tasks and tuner_slots on SQLite on the way down: with the store's
    foreign keys on, that used to delete every slot and task and null the workers' current task."""
    with Store.open(db_url) as store:
        task_id = _fill(store)
        before = _rows(store)
        assert len(before["slots"]) == 2 and ("busy", "busy", task_id) in before["workers"]
        migrate_to(store.engine, "0005")
        with store.engine.connect() as conn:
            assert current_revision(conn) == "0005"
            if conn.dialect.name == "sqlite":
                assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1, "the store's setting is restored"
                slots_sql = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = 'tuner_slots'").scalar()
                assert "AUTOINCREMENT" not in str(slots_sql).upper()
                assert ("sqlite_autoincrement", "tuner_slots", True) in schema_drift(conn)
        assert _rows(store) == before
        migrate_to(store.engine, "head")
        with store.engine.connect() as conn:
            assert current_revision(conn) == head_revision() and schema_drift(conn) == []
            if conn.dialect.name == "sqlite":
                seq = conn.exec_driver_sql("SELECT name, seq FROM sqlite_sequence WHERE name LIKE '%tuner_slots'").all()
                assert seq == [("tuner_slots", max(s[0] for s in before["slots"]))], seq
        assert _rows(store) == before
        assert [a.worker_id for a in store.list_attempts(task_id=task_id)] == []  # dropped with 0006's table
        assert _comparator_processes(store) == [None, None]  # dropped with 0008's column: every process
        slot = store.reserve_slot(task_id=task_id, worker_id="busy")
        assert slot is not None and slot > max(s[0] for s in before["slots"])


def test_down_to_0007_and_up_again_keeps_the_jobs_and_takes_comparator_processes_again(db_url: str) -> None:
    """0008 adds ``tuner_jobs.comparator_processes``: down, the column goes (a verify job queued with it then
    re-measures the comparators in every process) and every row stays; up again, old jobs read None and new
    jobs keep theirs."""
    with Store.open(db_url) as store:
        _fill(store)
        before = _rows(store)
        assert _comparator_processes(store) == [None, 1]
        migrate_to(store.engine, "0007")
        with store.engine.connect() as conn:
            assert current_revision(conn) == "0007"
            assert "comparator_processes" not in {c["name"] for c in inspect(conn).get_columns("tuner_jobs")}
            assert [tuple(r) for r in conn.execute(text(
                "SELECT kind, processes, max_attempts FROM tuner_jobs ORDER BY id"))] == [("tune", None, 3),
                                                                                      ("verify", 2, 2)]
        assert _rows(store) == before
        migrate_to(store.engine, "head")
        with store.engine.connect() as conn:
            assert current_revision(conn) == head_revision() and schema_drift(conn) == []
        assert _rows(store) == before and _comparator_processes(store) == [None, None]
        again = store.create_verify_job(template="t", template_version="1", backend="triton", device_kind="cpu",
                                        device_name=None, tasks=[("n=3", "n=3", '{"n": 3}')], processes=4,
                                        comparator_processes=3)
        assert store.get_job(job_id=again.id).comparator_processes == 3  # type: ignore[union-attr]
        assert _comparator_processes(store) == [None, None, 3]


def test_alembic_on_a_store_connection_with_sqlite_foreign_keys_on_is_refused(db_url: str) -> None:
    from alembic import command

    from tuner.db.migrate import alembic_config

    with Store.open(db_url) as store:
        _fill(store)
        before = _rows(store)
        if store.engine.dialect.name != "sqlite":
            pytest.skip("SQLite only")
        with pytest.raises(RuntimeError, match="foreign keys are on"), store.engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0005")
        assert _rows(store) == before


def test_down_to_0008_and_up_again_keeps_the_tasks_and_links_verifications_again(db_url: str) -> None:
    """0009 adds ``tuner_tasks.verification_id``: down, the column and its foreign key go (every row stays,
    the verification too); up again, the task reads None and a verify task finished then keeps its own."""
    from tests.fixtures.studies import study_fields

    with Store.open(db_url) as store:
        tuning = store.get_task(task_id=_fill(store))
        assert tuning is not None
        store.cancel_job(job_id=tuning.job_id)  # the verify jobs alone are left to claim
        study = store.get_or_create_study(**study_fields())
        check = store.add_verification(
            study_id=study.id, config_json='{"x": 1}', stored_us=5.0, median_us=None, low_us=None, high_us=None,
            drift=None, tolerance=0.03, flagged=True, processes=1, figures=[], device_kind="cpu", device_name="CPU",
            fingerprint_hash="f", fingerprint_json="{}")
        store.register_worker(worker_id="v", host="h", pid=1, device_kind="cpu", device_name="CPU", device_index=0,
                              backends=["triton"], fingerprint_hash="f", fingerprint_json="{}", lease_s=600.0)

        def verify(job_id: int) -> int:
            claim = store.claim_task(worker_id="v", device_kind="cpu", device_name="CPU", backends=["triton"])
            assert claim is not None and claim.job.id == job_id and store.begin_finalize(task_id=claim.task.id,
                                                                                          worker_id="v")
            store.finish_task(task_id=claim.task.id, worker_id="v", best_us=None, best_config_json=None,
                              verification_id=check.id)
            return claim.task.id

        (verify_job,) = [j for j in store.list_jobs() if j.kind == "verify"]
        first = verify(verify_job.id)
        assert store.verifications_by_task(task_ids=[first]) == {first: check}
        before = _rows(store)
        migrate_to(store.engine, "0008")
        with store.engine.connect() as conn:
            assert current_revision(conn) == "0008"
            assert "verification_id" not in {c["name"] for c in inspect(conn).get_columns("tuner_tasks")}
            assert conn.execute(text("SELECT COUNT(*) FROM tuner_verifications")).scalar() == 1
        assert _rows(store) == before
        migrate_to(store.engine, "head")
        with store.engine.connect() as conn:
            assert current_revision(conn) == head_revision() and schema_drift(conn) == []
        assert _rows(store) == before
        assert store.get_task(task_id=first).verification_id is None  # type: ignore[union-attr]
        again = store.create_verify_job(template="t", template_version="1", backend="triton", device_kind="cpu",
                                        device_name=None, tasks=[("n=3", "n=3", '{"n": 3}')], processes=1)
        second = verify(again.id)
        assert store.verifications_by_task(task_ids=[first, second]) == {second: check}


def test_down_to_0009_and_up_again_keeps_the_jobs_and_takes_idempotency_keys_again(db_url: str) -> None:
    """0010 adds ``tuner_jobs.idempotency_key`` (unique) and ``request_hash``: down, both go and every row stays;
    up again, old jobs have no key and a key is unique again."""
    with Store.open(db_url) as store:
        _fill(store)
        keyed = store.create_job(template="t", template_version="1", backend="triton", device_kind="cpu",
                                 device_name=None, trials=2, sampler="tpe", samples=3, candidate_timeout_s=10.0,
                                 tasks=[("k", "n=9", '{"n": 9}')], idempotency_key="k", request_hash="h")
        before = _rows(store)
        migrate_to(store.engine, "0009")
        with store.engine.connect() as conn:
            assert current_revision(conn) == "0009"
            columns = {c["name"] for c in inspect(conn).get_columns("tuner_jobs")}
            assert not {"idempotency_key", "request_hash"} & columns
        assert _rows(store) == before
        migrate_to(store.engine, "head")
        with store.engine.connect() as conn:
            assert current_revision(conn) == head_revision() and schema_drift(conn) == []
        assert _rows(store) == before and store.job_with_key(idempotency_key="k") is None
        assert store.get_job(job_id=keyed.id).idempotency_key is None  # type: ignore[union-attr]
        fields = {"template": "t", "template_version": "1", "backend": "triton", "device_kind": "cpu",
                  "device_name": None, "trials": 2, "sampler": "tpe", "samples": 3, "candidate_timeout_s": 10.0,
                  "tasks": [("k", "n=9", '{"n": 9}')], "idempotency_key": "k", "request_hash": "h"}
        again = store.create_job(**fields)
        with pytest.raises(RecordConflictError):  # the key is unique again
            store.create_job(**fields)
        assert store.job_with_key(idempotency_key="k").id == again.id  # type: ignore[union-attr]


def test_down_to_0010_and_up_again_drops_and_rebuilds_the_measurements_time_index(db_url: str) -> None:
    """0011 adds ``ix_tuner_measurements_study_created`` (the overview's latest-measured-first order reads a
    study's newest measurement through it): down, it goes and every row stays; up again, it is back."""
    def indexes(store: Store) -> set[str]:
        with store.engine.connect() as conn:
            return {str(i["name"]) for i in inspect(conn).get_indexes("tuner_measurements")}

    with Store.open(db_url) as store:
        _fill(store)
        before = _rows(store)
        assert "ix_tuner_measurements_study_created" in indexes(store)
        migrate_to(store.engine, "0010")
        assert "ix_tuner_measurements_study_created" not in indexes(store) and _rows(store) == before
        migrate_to(store.engine, "head")
        with store.engine.connect() as conn:
            assert current_revision(conn) == head_revision() == "0011" and schema_drift(conn) == []
        assert "ix_tuner_measurements_study_created" in indexes(store) and _rows(store) == before
