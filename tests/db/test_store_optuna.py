"""Optuna's RDBStorage and our store share one database; neither migrates the other's tables."""

from __future__ import annotations

from collections.abc import Iterator

import optuna
import pytest
from sqlalchemy import inspect, text

from tests.fixtures.studies import study_fields
from tuner.db import Store, get_or_create_study
from tuner.db.migrate import VERSION_TABLE, current_revision, head_revision, schema_drift

OPTUNA_TABLES = {"studies", "trials", "version_info", "alembic_version"}


@pytest.fixture(autouse=True)
def quiet_optuna() -> Iterator[None]:
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield
    optuna.logging.set_verbosity(verbosity)


def optuna_revision(store: Store) -> str:
    with store.engine.connect() as conn:
        return str(conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one())


def run_optuna(url: str, name: str, n_trials: int) -> int:
    """Create or load an Optuna study, run trials; return its number of trials."""
    storage = optuna.storages.RDBStorage(url)
    try:
        study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True)
        study.optimize(lambda trial: trial.suggest_int("BLOCK_H", 1, 16), n_trials=n_trials)
        return len(study.trials)
    finally:
        storage.engine.dispose()


def test_optuna_after_store_and_store_again(db_url: str) -> None:
    fields = study_fields()
    with Store.open(db_url) as store, store.session() as session:
        get_or_create_study(session, **fields)
        optuna_url = store.optuna_url
    assert run_optuna(optuna_url, fields["name"], 3) == 3  # creates Optuna's tables beside ours
    with Store.open(db_url) as store:
        with store.engine.connect() as conn:
            assert current_revision(conn) == head_revision()
            tables = set(inspect(conn).get_table_names())
            assert schema_drift(conn) == []  # autogenerate sees no Optuna table
        assert tables >= OPTUNA_TABLES | {"tuner_studies", VERSION_TABLE}
        before = optuna_revision(store)
    assert run_optuna(optuna_url, fields["name"], 2) == 5  # Optuna's version check still passes
    with Store.open(db_url) as store:
        assert optuna_revision(store) == before


def test_store_opens_a_database_optuna_created_first(db_url: str) -> None:
    assert run_optuna(db_url, "plain-optuna-study", 1) == 1
    with Store.open(db_url) as store:
        revision = optuna_revision(store)
        with store.engine.connect() as conn:
            assert current_revision(conn) == head_revision()
            assert conn.execute(text("SELECT count(*) FROM trials")).scalar() == 1
            assert schema_drift(conn) == []
    assert run_optuna(db_url, "plain-optuna-study", 1) == 2
    with Store.open(db_url) as store:
        assert optuna_revision(store) == revision
