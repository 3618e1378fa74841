"""Database faults against a real server and real workers (short versions of benchmarks/reliability.py).

Faults are made with the database's own means on a database of the test's own (tests/fixtures/faults.py):
refused connections plus terminated sessions for an outage, a TCP proxy that holds every byte for a
partition. The PostgreSQL server itself is never stopped.
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures import databases
from tests.fixtures.faults import FaultDatabase, TcpProxy
from tests.fixtures.servers import TOKENS, publish, thread_server
from tuner import db
from tuner.api.settings import ApiSettings

NAME = "fault_vector_scale_tunable"
pytestmark = pytest.mark.postgres


def _timed(call: object) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = call()  # type: ignore[operator]
    return response, time.monotonic() - started


def test_a_partition_gives_503_within_5_s_best_answers_stale_and_the_server_recovers(
    fault_db: FaultDatabase,
) -> None:
    from tests.fixtures.fault_templates import TUNABLE_REF
    from tuner import registry

    registry.register(NAME, TUNABLE_REF)
    proxy = TcpProxy(fault_db.server_host, fault_db.server_port)
    store = db.Store.open(fault_db.url(port=proxy.port, host="127.0.0.1"))
    publish(store, NAME, {"n": 256}, {"mode": "ok", "BLOCK": 64}, 4.0)
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False,  # type: ignore[arg-type]
                           best_cache_ttl_s=0.3)
    best = {"template": NAME, "device": "cpu", "n": 256}
    try:
        with thread_server(settings, store) as base, httpx.Client(base_url=base, timeout=60) as http:
            assert http.get("/v1/jobs").status_code == 200  # a pooled connection, held through the partition
            fresh = http.get("/v1/best", params=best).json()
            assert fresh["match"] == "exact" and fresh["stale"] is False
            proxy.partition()
            for path in ("/v1/jobs", "/readyz", "/v1/workers", "/v1/jobs"):
                response, took = _timed(lambda path=path: http.get(path))
                assert response.status_code == 503 and took <= 5.0, (path, response.status_code, took)
                assert response.json()["detail"].startswith("store unavailable")
            time.sleep(0.7)  # past the answer's freshness: its refresh fails, the last answer is served stale
            stale, took = _timed(lambda: http.get("/v1/best", params=best))
            assert stale.status_code == 200 and took <= 5.0
            assert stale.headers.get("x-stale") == "true" and stale.json()["stale"] is True
            assert stale.json()["config"] == fresh["config"]
            proxy.heal()
            deadline = time.monotonic() + 15
            while http.get("/v1/jobs").status_code != 200:
                assert time.monotonic() < deadline, "the server did not recover by itself"
                time.sleep(0.2)
            recovered = time.monotonic() + 10
            while http.get("/v1/best", params=best).json()["stale"]:
                assert time.monotonic() < recovered, "best answers stayed stale after the store came back"
                time.sleep(0.2)
    finally:
        store.close()
        proxy.close()


def test_a_studys_importance_survives_a_blip_and_answers_503_through_a_partition(fault_db: FaultDatabase) -> None:
    """The importance endpoint reads Optuna's storage, which it opened itself without the store's deadlines
    or error translation: a blip (every session of the database cut) answered a plain 500, a partition held
    the request until TCP gave up. Now the storage is the workers' (guarded) and its errors are StoreError."""
    from tests.fixtures.fault_templates import TUNABLE_REF
    from tuner import registry

    registry.register(NAME, TUNABLE_REF)
    proxy = TcpProxy(fault_db.server_host, fault_db.server_port)
    store = db.Store.open(fault_db.url(port=proxy.port, host="127.0.0.1"))
    path = f"/v1/studies/{publish(store, NAME, {'n': 256}, {'mode': 'ok', 'BLOCK': 64}, 4.0).study_id}/importance"
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    try:
        with thread_server(settings, store) as base, httpx.Client(base_url=base, timeout=60) as http:
            first = http.get(path)  # Optuna's storage opened, its connection pooled
            assert first.status_code == 200 and first.json()["trials"] == 0, first.text
            fault_db.refuse()  # a blip: every session of the database cut, then connections allowed again
            fault_db.allow()
            after = http.get(path)
            assert after.status_code == 200, after.text  # the pooled connection is checked and replaced
            proxy.partition()
            response, took = _timed(lambda: http.get(path))
            assert response.status_code == 503 and took <= 5.0, (response.status_code, response.text, took)
            assert response.json()["detail"].startswith("store unavailable")
            proxy.heal()
            deadline = time.monotonic() + 15
            while http.get(path).status_code != 200:
                assert time.monotonic() < deadline, "the importance did not recover by itself"
                time.sleep(0.2)
    finally:
        store.close()
        proxy.close()


def _open_optuna_storage(url: str, go: Any, errors: Any) -> None:
    # In a forked child: wait for the others, then create Optuna's storage (its tables on first use).
    try:
        from tuner.store import TrialHeartbeats

        store = db.Store.open(url)
        go.wait(30)
        store.optuna_storage(heartbeats=TrialHeartbeats(interval_s=1, grace_s=4)).engine.dispose()  # type: ignore[attr-defined]
        store.close()
    except BaseException as exc:
        errors.put(f"{type(exc).__name__}: {exc}")
        raise


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_starters_on_a_fresh_database_create_optunas_tables_once(
    backend: str, fault_db: FaultDatabase, tmp_path: Path
) -> None:
    """Four processes create Optuna's storage at the same instant on a database without its tables (the
    fault: IntegrityError on PostgreSQL, "table … already exists" on SQLite). Under the store's schema lock
    one creates them and the others wait: every process succeeds, three times over."""
    context = multiprocessing.get_context("fork")
    for attempt in range(3):
        url = fault_db.url() if backend == "postgresql" else databases.sqlite_file_url(tmp_path / f"f{attempt}.db")
        if backend == "postgresql":
            fault_db.reset()
        go, errors = context.Event(), context.Queue()
        children = [context.Process(target=_open_optuna_storage, args=(url, go, errors)) for _ in range(4)]
        for child in children:
            child.start()
        time.sleep(1.0)
        go.set()
        for child in children:
            child.join(60)
        found = []
        while not errors.empty():
            found.append(errors.get())
        assert [c.exitcode for c in children] == [0] * 4 and not found, (attempt, found)


def test_a_commit_or_rollback_without_an_answer_is_given_up_and_a_vanished_writers_lock_is_freed(
    fault_db: FaultDatabase,
) -> None:
    """A partition that begins between a transaction's last statement and its COMMIT (or its ROLLBACK): the
    client gives up within the statement deadline (4 s), as for a statement; and the server ends the
    transaction that client left open within ``idle_in_transaction_s`` (12 s), so that the lock it held on a
    worker's row stops hiding that worker from the reaper (SKIP LOCKED) once its lease has run out. Before,
    the COMMIT waited for TCP (hours) and the lock stayed."""
    from sqlalchemy import text

    from tuner.errors import StoreError

    proxy = TcpProxy(fault_db.server_host, fault_db.server_port)
    dying = db.Store.open(fault_db.url(port=proxy.port, host="127.0.0.1"))
    other = db.Store.open(fault_db.url())
    try:
        assert dying.settings.idle_in_transaction_s == 12.0
        fields = {"host": "h", "device_kind": "cpu", "device_name": "c", "device_index": 0, "backends": ["triton"],
                  "fingerprint_hash": "f", "fingerprint_json": "{}", "lease_s": 2.0}
        dying.register_worker(worker_id="w-dying", pid=1, **fields)
        with dying.session(readonly=True) as session:
            assert session.execute(text("SHOW idle_in_transaction_session_timeout")).scalar() == "12s"

        started = time.monotonic()
        with pytest.raises(StoreError), dying.session() as session:  # the COMMIT: cut at its deadline
            session.execute(text("UPDATE tuner_workers SET last_heartbeat = now() WHERE id = 'w-dying'"))
            proxy.partition()
        assert time.monotonic() - started <= 5.5
        partitioned = time.monotonic()
        # the server still holds that transaction, and with it the worker's row: the reaper skips the row
        assert other.reap_lost_workers() == []
        while other.reap_lost_workers() != ["w-dying"]:
            assert time.monotonic() - partitioned < 20, "the lock of a vanished client's transaction stayed"
            time.sleep(0.5)

        proxy.heal()
        dying.register_worker(worker_id="w-two", pid=2, **fields)
        started = time.monotonic()
        # the ROLLBACK after a caller's error: not waited on either
        with pytest.raises((StoreError, KeyError)), dying.session() as session:
            session.execute(text("SELECT 1"))
            proxy.partition()
            raise KeyError("the caller's error")
        assert time.monotonic() - started <= 5.5
    finally:
        proxy.close()
        dying.close()
        other.close()
