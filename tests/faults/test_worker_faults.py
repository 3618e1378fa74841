"""Real worker processes through database outages and SIGTERM (short versions of benchmarks/reliability.py).

Workers run with ``--heartbeat 1 --lease 5`` on a PostgreSQL database of the test's own; an outage is
``ALLOW_CONNECTIONS false`` plus ``pg_terminate_backend`` of every session on that database.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from tests.fixtures.faults import FaultDatabase, Outcome, TcpProxy, submit, wait_job
from tests.fixtures.processes import start_worker, stop_all, wait_for
from tuner import db

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
WORKER_ARGS = ("--heartbeat", "1", "--lease", "5")


def test_workers_survive_outages_and_the_job_ends_with_exactly_its_trials(
    fault_db: FaultDatabase, tmp_path: Path
) -> None:
    """Two blips and one outage longer than the lease during a 24-trial job on two workers: no worker dies,
    the job is done with exactly 24 measurements, none measured twice."""
    store = db.Store.open(fault_db.url())
    job_id = submit(store, trials=24)
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    workers = [start_worker(fault_db.url(), *WORKER_ARGS, log=log) for log in logs]
    try:
        wait_for(lambda: Outcome.of(store, job_id).trials_done >= 3, 240, "the first trials")
        for seconds in (2.0, 2.0, 8.0):
            with fault_db.outage(seconds):
                pass
            time.sleep(3.0)
        outcome = wait_job(store, job_id, 300)
        alive = [w.poll() is None for w in workers]
    finally:
        codes = stop_all(workers)
    texts = [log.read_text() for log in logs]
    assert alive == [True, True], "\n".join(t[-3000:] for t in texts)
    assert outcome == Outcome("done", 24, 24, 0), outcome
    assert codes == [0, 0] and not any("Traceback" in t for t in texts), "\n".join(t[-3000:] for t in texts)
    assert any("store unavailable" in t for t in texts) and any("store back after" in t for t in texts)
    store.close()


def test_workers_whose_commit_answers_are_lost_store_every_trial_and_the_round_once(
    fault_db: FaultDatabase, tmp_path: Path
) -> None:
    """Two workers reach the database through a proxy that loses the answer of every 60th COMMIT (the server
    committed; the connection drops before the client hears it): registrations, claims, slots, trials,
    Optuna's writes, the final round and its publish are all sent again, or the task is left and claimed
    again. No worker dies, the job is done with exactly its 8 trials, none measured twice, one final round
    stored once and published."""
    proxy = TcpProxy(fault_db.server_host, fault_db.server_port)
    url = fault_db.url(host="127.0.0.1", port=proxy.port)
    store = db.Store.open(fault_db.url())
    job_id = submit(store, trials=8)
    proxy.lose_commit_answers(60)
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    workers = [start_worker(url, "--heartbeat", "2", "--lease", "30", log=log) for log in logs]
    try:
        outcome = wait_job(store, job_id, 420)
        alive = [w.poll() is None for w in workers]
    finally:
        codes = stop_all(workers)
        proxy.close()
    texts = [log.read_text() for log in logs]
    print(f"{proxy.commits} commits, {proxy.answers_lost} answers lost")
    assert proxy.answers_lost >= 2, proxy.answers_lost
    assert alive == [True, True] and codes == [0, 0], "\n".join(t[-3000:] for t in texts)
    assert not any("Traceback" in t for t in texts), "\n".join(t[-3000:] for t in texts)
    assert outcome == Outcome("done", 8, 8, 0), outcome
    (task,) = store.get_job(job_id=job_id).tasks  # type: ignore[union-attr]
    finals = store.list_measurements(study_id=task.study_id, role="final")  # type: ignore[arg-type]
    assert len({f.round_id for f in finals}) == 1 and len(finals) == len({(f.candidate, f.config_json) for f in finals})
    best = store.get_study_best(study_id=task.study_id)  # type: ignore[arg-type]
    assert best is not None and best.measurement_id in {f.id for f in finals}
    store.close()


def test_sigterm_ends_a_hanging_candidate_requeues_its_config_and_exits_within_5_s(
    fault_db: FaultDatabase, tmp_path: Path
) -> None:
    store = db.Store.open(fault_db.url())
    job_id = submit(store, trials=3, template="fault_vector_scale_hang_all", timeout_s=600)
    log = tmp_path / "w.log"
    worker = start_worker(fault_db.url(), *WORKER_ARGS, log=log)
    engine = create_engine(fault_db.url(), poolclass=NullPool)

    def measuring() -> bool:  # a trial asked, with parameters: its candidate is being measured
        with engine.connect() as conn:
            return bool(conn.execute(text(
                "SELECT count(*) FROM trials t JOIN trial_params p ON p.trial_id = t.trial_id "
                "WHERE t.state = 'RUNNING'")).scalar())

    try:
        wait_for(lambda: worker.poll() is None and _has_optuna(engine) and measuring(), 240, "a measurement")
        time.sleep(2.0)  # well inside the hanging candidate
        started = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
        took = time.monotonic() - started
    finally:
        if worker.poll() is None:
            worker.kill()
    text_ = log.read_text()
    assert code == 0 and took <= 5.0, (code, took, text_[-3000:])
    with engine.connect() as conn:
        waiting = conn.execute(text("SELECT count(*) FROM trials WHERE state = 'WAITING'")).scalar()
        running = conn.execute(text("SELECT count(*) FROM trials WHERE state = 'RUNNING'")).scalar()
    assert waiting == 1 and running == 0, "the interrupted config is queued again, no trial left running"
    with store.session() as session:
        job = db.get_job(session, job_id=job_id)
        (w,) = db.list_workers(session, include_stopped=True)
    assert job is not None and job.tasks[0].trials_reserved == 0 and job.tasks[0].trials_done == 0
    assert w.state == "stopped"
    engine.dispose()
    store.close()


def _has_optuna(engine: object) -> bool:
    with engine.connect() as conn:  # type: ignore[attr-defined]
        return bool(conn.execute(text("SELECT to_regclass('trials') IS NOT NULL")).scalar())
