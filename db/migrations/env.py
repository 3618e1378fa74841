"""Alembic environment for tuner's tables only (prefix ``tuner_``, version table ``tuner_alembic_version``).

Run by :func:`tuner.db.migrate.upgrade_to_head` with an open connection in ``config.attributes["connection"]``
(already inside a transaction, which the caller commits). Without one (offline ``--sql`` or a config
made with ``alembic_config(url=...)``) it uses ``sqlalchemy.url``. Optuna's tables in the same database
are invisible here: the include filters of :mod:`tuner.db.migrate` drop every name without our prefix.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import create_engine, pool
from sqlalchemy.engine import Connection

from tuner.db.migrate import VERSION_TABLE, include_name, include_object
from tuner.db.models import Base

_OPTIONS: dict[str, Any] = {
    "target_metadata": Base.metadata,
    "version_table": VERSION_TABLE,
    "include_name": include_name,
    "include_object": include_object,
    "render_as_batch": True,  # SQLite can only ALTER through table copies
    "compare_type": True,
}


def _run_offline() -> None:
    context.configure(url=context.config.get_main_option("sqlalchemy.url"), literal_binds=True, **_OPTIONS)
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection: Connection) -> None:
    if connection.dialect.name == "sqlite" and connection.exec_driver_sql("PRAGMA foreign_keys").scalar():
        # Batch mode rebuilds tables by dropping them: with foreign keys on, that deletes or nulls the rows
        # referring to them. PRAGMA foreign_keys cannot change inside a transaction: tuner.db.migrate.migrate_to
        # switches them off before it begins one.
        raise RuntimeError("SQLite foreign keys are on: migrate with tuner.db.migrate.migrate_to")
    context.configure(connection=connection, **_OPTIONS)
    with context.begin_transaction():
        context.run_migrations()


def _run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("db/migrations/env.py: no connection and no sqlalchemy.url")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.begin() as connection:
        _run_on(connection)


if context.is_offline_mode():
    _run_offline()
else:
    _run_online()
