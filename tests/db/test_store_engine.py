"""Store.open, migrations and the session scope, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import inspect, make_url, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from tests.fixtures.databases import PostgresSandbox
from tests.fixtures.studies import study_fields
from tuner.db import (
    RecordConflictError,
    Store,
    StudyRecord,
    add_measurement,
    count_measurements,
    default_path,
    default_url,
    get_or_create_study,
    get_study,
    list_measurements,
    list_studies,
    mask_url,
)
from tuner.db.migrate import VERSION_TABLE, current_revision, head_revision, schema_drift
from tuner.errors import StoreError

StudyFactory = Callable[..., StudyRecord]
OUR_TABLES = {
    "tuner_studies", "tuner_measurements", "tuner_best_configs",  # 0001
    "tuner_jobs", "tuner_tasks", "tuner_workers", "tuner_slots",  # 0002
    "tuner_verifications",  # 0004
    "tuner_task_attempts",  # 0006
    VERSION_TABLE,
}


def test_open_migrates_an_empty_database_to_head(db_url: str) -> None:
    with Store.open(db_url) as store, store.engine.connect() as conn:
        assert current_revision(conn) == head_revision() == "0011"
        assert set(inspect(conn).get_table_names()) == OUR_TABLES


def test_migrations_match_the_models(store: Store) -> None:
    with store.engine.connect() as conn:
        assert schema_drift(conn) == []


def test_open_twice_keeps_data_and_revision(db_url: str, make_study: StudyFactory) -> None:
    study = make_study()
    with Store.open(db_url) as again:
        with again.session() as session:
            assert get_study(session, name=study.name) == study
        with again.engine.connect() as conn:
            assert current_revision(conn) == head_revision()
            rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    assert rows == [("0011",)]


def test_a_database_at_0002_is_upgraded_keeping_its_measurements(db_url: str) -> None:
    """0003 adds ``kernels_json``; measurements stored before it read back with an empty breakdown."""
    from alembic import command
    from sqlalchemy import create_engine

    from tuner.db.migrate import alembic_config

    engine = create_engine(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0002")
        conn.execute(text(
            "INSERT INTO tuner_studies (name, template, template_version, shape_key, shape_json, device_kind,"
            " device_name, fingerprint_hash, fingerprint_json, created_at) VALUES ('s', 't', '1', 'n=1',"
            " '{}', 'cpu', 'cpu', 'f', '{}', CURRENT_TIMESTAMP)"))
        conn.execute(text(
            "INSERT INTO tuner_measurements (study_id, role, candidate, config_json, status, errors_json,"
            " median_us, created_at) SELECT id, 'trial', 'config', '{}', 'OK', '{}', 2.5, CURRENT_TIMESTAMP"
            " FROM tuner_studies"))
    engine.dispose()
    with Store.open(db_url) as store, store.session() as session:
        (study,) = list_studies(session)
        (row,) = list_measurements(session, study_id=study.id)
        assert row.median_us == 2.5 and row.kernels == {}
        with store.engine.connect() as conn:
            assert current_revision(conn) == "0011" and schema_drift(conn) == []


OLD_JOB = text(  # a job as stored by revisions 0002 to 0005
    "INSERT INTO tuner_jobs (template, template_version, backend, device_kind, trials, sampler, samples,"
    " candidate_timeout_s, finalists, comparators, priority, state, created_at, updated_at) VALUES"
    " ('t', '1', 'triton', 'cpu', 4, 'tpe', 10, 5.0, 1, false, 0, 'queued', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
)


def test_a_database_at_0003_keeps_its_jobs_as_tuning_jobs(db_url: str) -> None:
    """0004 adds job kinds and verifications; jobs queued before it are tuning jobs."""
    from alembic import command
    from sqlalchemy import create_engine

    from tuner.db import get_job
    from tuner.db.migrate import alembic_config

    engine = create_engine(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0003")
        conn.execute(OLD_JOB)
    engine.dispose()
    with Store.open(db_url) as store, store.session() as session:
        job = get_job(session, job_id=1)
        assert job is not None and job.kind == "tune" and job.processes is None
        with store.engine.connect() as conn:
            assert current_revision(conn) == "0011" and schema_drift(conn) == []


def test_a_database_at_0005_keeps_its_workers_and_tasks(db_url: str) -> None:
    """0006 adds advertised templates and task attempts: workers registered before claim any template, tasks
    queued before have no attempt."""
    from alembic import command
    from sqlalchemy import create_engine

    from tuner.db import get_job, list_workers
    from tuner.db.migrate import alembic_config

    engine = create_engine(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0005")
        conn.execute(OLD_JOB)
        conn.execute(text(
            "INSERT INTO tuner_tasks (job_id, position, label, shape_key, shape_json, state, trials_target,"
            " trials_reserved, trials_done, trials_failed, updated_at) VALUES (1, 0, 'n=1', 'n=1', '{}', 'queued',"
            " 4, 0, 0, 0, CURRENT_TIMESTAMP)"))
        conn.execute(text(
            "INSERT INTO tuner_workers (id, host, pid, device_kind, device_name, device_index, backends_json,"
            " fingerprint_hash, fingerprint_json, state, started_at, last_heartbeat, lease_expires_at) VALUES"
            " ('w', 'h', 1, 'cpu', 'CPU', 0, '[\"triton\"]', 'f', '{}', 'idle', CURRENT_TIMESTAMP,"
            " CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
        conn.execute(text("INSERT INTO tuner_slots (task_id, worker_id, state, created_at) VALUES (1, 'w', 'done',"
                          " CURRENT_TIMESTAMP)"))
    engine.dispose()
    with Store.open(db_url) as store:
        with store.session() as session:
            job = get_job(session, job_id=1)
            (worker,) = list_workers(session)
            assert session.execute(text("SELECT worker_id, state FROM tuner_slots")).all() == [("w", "done")]
        assert job is not None and job.tasks[0].attempts == 0 and worker.templates is None
        assert store.claim_task(worker_id="w", device_kind="cpu", device_name="CPU", backends=["triton"]) is not None
        with store.engine.connect() as conn:
            assert current_revision(conn) == "0011" and schema_drift(conn) == []


def test_database_migrated_by_a_newer_tuner_is_refused(db_url: str) -> None:
    with Store.open(db_url) as store, store.session() as session:
        session.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    with pytest.raises(StoreError, match="9999"):
        Store.open(db_url)


def test_sqlite_connections_use_wal_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'x.db'}") as store:
        assert store.dialect == "sqlite"
        with store.session(readonly=True) as session:
            assert session.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert session.execute(text("PRAGMA busy_timeout")).scalar() == 30000
            assert session.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert store.optuna_url.endswith("x.db?timeout=30")


def test_a_copy_of_a_store_in_use_holds_what_its_wal_file_holds(tmp_path: Path) -> None:
    """A store open in another connection keeps its latest commits in its -wal file: a copy of the main file
    alone can lack even the tables; copy_database takes one consistent snapshot."""
    import sqlite3

    from tuner.db import copy_database, sqlite_url

    path = tmp_path / "live.db"
    with Store.open(f"sqlite:///{path}") as store:
        reader = sqlite3.connect(path)  # a second connection: its reads keep the WAL from being folded back
        try:
            reader.execute("SELECT count(*) FROM sqlite_master").fetchall()
            with store.session() as session:
                study = get_or_create_study(session, **study_fields())
            assert Path(f"{path}-wal").stat().st_size > 0
            copy_database(path, tmp_path / "copy.db")
        finally:
            reader.close()
    with Store.open(f"sqlite:///{tmp_path / 'copy.db'}") as copy:
        assert [s.id for s in copy.list_studies()] == [study.id]
    # A failed copy leaves the target as it was, and nothing beside it.
    (tmp_path / "not-a-db").write_text("plain text, not a database")
    before = (tmp_path / "copy.db").read_bytes()
    with pytest.raises(sqlite3.Error):
        copy_database(tmp_path / "not-a-db", tmp_path / "copy.db")
    assert (tmp_path / "copy.db").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".copy.db")) == []
    with pytest.raises(ValueError, match="both the source and the target"):
        copy_database(tmp_path / "copy.db", tmp_path / "." / "copy.db")
    odd = tmp_path / "a%41 b?c#d"  # characters a file URI must escape
    odd.mkdir()
    copy_database(tmp_path / "copy.db", odd / "x.db")
    copy_database(odd / "x.db", tmp_path / "back.db")
    with Store.open(sqlite_url(tmp_path / "back.db")) as again:
        assert [s.id for s in again.list_studies()] == [study.id]


def test_a_store_in_a_folder_whose_name_holds_url_characters(tmp_path: Path) -> None:
    """``?``, ``#`` and ``%`` in a path would be a query, a fragment and an escape in a plain URL: sqlite_url
    names the file anyway, and the store, its schema lock and Optuna's storage all use that file."""
    import optuna

    from tuner.db import sqlite_file, sqlite_url

    odd = tmp_path / "runs?v=2#best 100%"
    odd.mkdir()
    url = sqlite_url(odd / "t.db")
    assert sqlite_file(url) == odd / "t.db"
    with Store.open(url) as store:
        with store.session() as session:
            study = get_or_create_study(session, **study_fields())
        with store.schema_lock():
            assert (odd / "t.db.schema-lock").exists()
        storage = optuna.storages.RDBStorage(store.optuna_url)
        optuna.create_study(storage=storage, study_name="odd")
        storage.remove_session()
        storage.engine.dispose()
    assert sorted(p.name for p in tmp_path.iterdir()) == [odd.name]  # nothing written beside the folder
    with Store.open(sqlite_url(odd / "t.db")) as again:
        assert [s.id for s in again.list_studies()] == [study.id]
        with again.session(readonly=True) as session:
            tables = set(inspect(session.get_bind()).get_table_names())
    assert {"tuner_studies", "studies"} <= tables  # ours and Optuna's, in the one file
    # Plain paths keep the plain form; other databases name no file.
    assert sqlite_url(tmp_path / "plain.db") == f"sqlite:///{tmp_path / 'plain.db'}"
    assert sqlite_file(f"sqlite:///{tmp_path / 'plain.db'}") == tmp_path / "plain.db"
    assert sqlite_file("sqlite://") is None and sqlite_file("postgresql+psycopg://u@h/db") is None
    # URI filenames written by hand: in-memory ones name no file; uri=1 is as good as uri=true.
    assert sqlite_file("sqlite:///file:memdb1?mode=memory&cache=shared&uri=true") is None
    assert sqlite_file("sqlite:///file::memory:?uri=true") is None
    assert sqlite_file(f"sqlite:///file:{tmp_path}/u.db?uri=1") == tmp_path / "u.db"


@pytest.mark.postgres
def test_postgres_optuna_url_keeps_the_password_and_adds_a_timeout(
    postgres_sandbox: PostgresSandbox,
) -> None:
    url = make_url(postgres_sandbox.new_url()).set(password="pw")  # trust auth ignores it
    with Store.open(url.render_as_string(hide_password=False)) as store:
        assert store.dialect == "postgresql"
        assert ":***@" in store.url
        optuna_url = make_url(store.optuna_url)
    assert optuna_url.password == "pw"
    # The store's timeouts (db.settings defaults), the URL's own options kept.
    options = f"{url.query['options']} -c statement_timeout=3000 -c idle_in_transaction_session_timeout=12000"
    assert optuna_url.query == {**url.query, "connect_timeout": "2", "options": options}
    with Store.open(url.render_as_string(hide_password=False)) as store, store.session() as session:
        assert session.execute(text("SHOW statement_timeout")).scalar() == "3s"


def test_the_statement_timeout_is_a_typed_setting_of_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from tuner.db.settings import StoreSettings

    monkeypatch.delenv("TUNER_DB_STATEMENT_TIMEOUT_S", raising=False)
    default = StoreSettings()
    assert (default.statement_timeout_s, default.statement_deadline_s) == (3.0, 4.0)
    monkeypatch.setenv("TUNER_DB_STATEMENT_TIMEOUT_S", "2.5")
    assert StoreSettings().statement_timeout_s == 2.5 and StoreSettings().statement_deadline_s == 3.5
    for bad in ("0", "-1", "ten"):
        monkeypatch.setenv("TUNER_DB_STATEMENT_TIMEOUT_S", bad)
        with pytest.raises(ValidationError):
            StoreSettings()


def test_a_stuck_statement_cannot_outlast_a_live_trials_heartbeat_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A heartbeat beat stuck in a statement until its deadline delays the trial heartbeats by up to two
    intervals plus the deadline: with the default worker options that must stay inside the Optuna grace (else
    another worker fails a live trial as stale and measures its config again) and inside the lease."""
    from tuner.db.settings import StoreSettings
    from tuner.driver.study import trial_heartbeats
    from tuner.service.worker import WorkerOptions

    monkeypatch.delenv("TUNER_DB_STATEMENT_TIMEOUT_S", raising=False)
    options = WorkerOptions()  # the defaults `tuner worker` and `tuner serve` use
    beats = trial_heartbeats(options.heartbeat_s)
    worst = 2 * options.heartbeat_s + StoreSettings().statement_deadline_s
    assert worst < beats.grace_s and worst < options.lease_s


@pytest.mark.postgres
def test_the_server_applies_the_statement_timeout_from_the_environment(
    postgres_sandbox: PostgresSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.db.settings import StoreSettings

    monkeypatch.setenv("TUNER_DB_STATEMENT_TIMEOUT_S", "2.5")
    with Store.open(postgres_sandbox.new_url(), settings=StoreSettings()) as store:
        assert "statement_timeout=2500" in make_url(store.optuna_url).query["options"]
        with store.session() as session:
            assert session.execute(text("SHOW statement_timeout")).scalar() == "2500ms"


def test_default_location_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TUNER_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home/.local/share/tuner/tuner.db"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg/tuner/tuner.db"
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "th" / "deep"))
    assert default_url() == f"sqlite:///{tmp_path}/th/deep/tuner.db"
    with Store.open(None) as store:  # creates the directory
        assert store.url == default_url()
    assert (tmp_path / "th/deep/tuner.db").is_file()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_postgres_fails_fast_with_a_masked_url() -> None:
    port = _closed_port()
    start = time.monotonic()
    with pytest.raises(StoreError) as info:
        Store.open(f"postgresql+psycopg://tuner:s3cret@127.0.0.1:{port}/tuner")
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert "\n" not in message
    assert f"postgresql+psycopg://tuner:***@127.0.0.1:{port}/tuner" in message
    assert "s3cret" not in message
    assert "OperationalError" in message


@pytest.mark.parametrize(
    ("url", "cause"),
    [
        ("not a url", "ArgumentError"),
        ("nosuchdb://u:s3cret@host/db", "NoSuchModuleError"),
        ("postgresql+nodriver://u:s3cret@host/db", "NoSuchModuleError"),
    ],
)
def test_malformed_urls_and_unknown_drivers_raise_store_error(url: str, cause: str) -> None:
    with pytest.raises(StoreError, match=cause) as info:
        Store.open(url)
    assert "s3cret" not in str(info.value)


def test_sqlite_file_in_a_missing_directory_raises_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no/such/dir"):
        Store.open(f"sqlite:///{tmp_path}/no/such/dir/x.db")


def test_mask_url_hides_passwords_even_in_unparsable_urls() -> None:
    assert mask_url("postgresql+psycopg://u:pw@h:5432/d") == "postgresql+psycopg://u:***@h:5432/d"
    assert "pw" not in mask_url("weird:://u:pw@h")


def test_session_commits_on_success_and_rolls_back_on_error(store: Store) -> None:
    with pytest.raises(RuntimeError, match="boom"), store.session() as session:
        study = get_or_create_study(session, **study_fields())
        raise RuntimeError("boom")  # passes through untranslated
    with store.session() as session:
        assert get_study(session, name=study.name) is None
        study = get_or_create_study(session, **study_fields())
    with store.session(readonly=True) as session:
        assert get_study(session, study_id=study.id) == study


def test_session_translates_database_errors_once(store: Store) -> None:
    with pytest.raises(StoreError) as info, store.session() as session:
        session.execute(text("SELECT * FROM no_such_table"))
    assert isinstance(info.value.__cause__, SQLAlchemyError)
    assert str(info.value).startswith(f"store {store.url}: ")
    assert "\n" not in str(info.value)


def test_database_checks_guard_the_role_column(store: Store, make_study: StudyFactory) -> None:
    study = make_study()
    # A broken constraint is the caller's data, not an outage: RecordConflictError (409), not StoreError (503).
    with pytest.raises(RecordConflictError), store.session() as session:
        session.execute(
            text(
                "INSERT INTO tuner_measurements (study_id, role, candidate, config_json, status, errors_json,"
                " created_at) VALUES (:s, 'bogus', 'config', '{}', 'OK', '{}', CURRENT_TIMESTAMP)"
            ),
            {"s": study.id},
        )


def test_one_store_is_shared_by_writer_threads(store: Store, make_study: StudyFactory) -> None:
    study = make_study()
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for i in range(8):
                with store.session() as session:
                    add_measurement(
                        session, study_id=study.id, role="trial", candidate="config",
                        config_json={"thread": n, "i": i}, status="OK", median_us=float(i),
                    )  # fmt: skip
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with store.session(readonly=True) as session:
        assert count_measurements(session, study_id=study.id) == 32


def _backend_pid(session: Session) -> int | None:
    if session.get_bind().dialect.name != "postgresql":
        return None
    return int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_writes_through_its_own_connections(store: Store, make_study: StudyFactory) -> None:
    study = make_study()
    with store.session() as session:  # leaves a pooled connection for the child to inherit
        parent_backend = _backend_pid(session)
    pid = os.fork()
    if pid == 0:  # child: must open its own connection (on PostgreSQL: another server backend)
        code = 1
        try:
            with store.session() as session:
                add_measurement(
                    session, study_id=study.id, role="trial", candidate="config", config_json={}, status="OK"
                )
                own = _backend_pid(session)
            code = 0 if own is None or own != parent_backend else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with store.session() as session:  # the parent's pooled connection still works
        assert _backend_pid(session) == parent_backend
        assert count_measurements(session, study_id=study.id) == 1


def test_a_disarmed_deadline_has_run_or_never_will() -> None:
    """The watchdog cut a connection whose deadline expired just as it finished: with the cut still running
    when disarm() returned, the connection could be back in the pool, then cut under the next thread that took
    it. disarm() now returns only once the action it raced has run."""
    import threading
    import time

    from tuner.db.deadline import Watchdog

    watchdog, entered, done = Watchdog(), threading.Event(), threading.Event()

    def slow_cut() -> None:
        entered.set()
        time.sleep(0.3)
        done.set()

    token = watchdog.arm(0.0, slow_cut)
    assert entered.wait(10)
    watchdog.disarm(token)  # the action is running: disarm waits for it
    assert done.is_set()
    never = threading.Event()
    watchdog.disarm(watchdog.arm(30.0, never.set))  # disarmed before its deadline: never runs
    time.sleep(0.1)
    assert not never.is_set()
