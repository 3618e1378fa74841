"""Alembic, driven from code: no alembic.ini at run time, only our tables, our own version table.

Our tables all start with ``tuner_`` and our revisions are recorded in ``tuner_alembic_version``;
Optuna's RDBStorage keeps its tables and its ``alembic_version`` in the same database. The filters
below keep autogenerate away from anything without our prefix, so neither side migrates the other.

Revisions live in ``db/migrations/versions/NNNN_<slug>.py`` with ``revision = "NNNN"`` and
``down_revision`` the previous number. To draft the next one against a database at head::

    from alembic import command
    from tuner.db import Store
    from tuner.db.migrate import alembic_config
    with Store.open(url) as store, store.engine.begin() as conn:
        command.revision(alembic_config(conn), message="jobs", autogenerate=True, rev_id="0002")

then review the generated file (SQLite needs ``batch_alter_table`` for ALTERs; env.py renders them).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.engine import Connection

from tuner.db import sqlite

TABLE_PREFIX = "tuner_"
VERSION_TABLE = "tuner_alembic_version"
MIGRATIONS_DIR = Path(__file__).resolve().with_name("migrations")
# Alembic's ``context`` and ``op`` are module-level proxies: one migration per process at a time.
_IN_PROCESS = threading.Lock()
# Key of the PostgreSQL advisory lock that serialises concurrent migrators ("tuner" in ASCII).
_PG_LOCK_KEY = 0x74756E6572


class MigrationError(Exception):
    """The database's schema revision cannot be brought to this code's head (Store.open translates it)."""


def alembic_config(connection: Connection | None = None, *, url: str | None = None) -> Config:
    """An in-memory Alembic config pointing at our migrations; env.py uses ``connection`` when given."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest revision this code knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "db/migrations/versions holds no revision"
    return head


def known_revisions() -> set[str]:
    return {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current_revision(connection: Connection) -> str | None:
    """The revision recorded in ``tuner_alembic_version`` (None for a database we never migrated)."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def upgrade_to_head(engine: Engine) -> None:
    """Bring our tables to head, safely against concurrent callers; a no-op when already there.

    Migrators are serialised (within a process by a lock; across processes by ``BEGIN IMMEDIATE`` on
    SQLite, a transaction-scoped advisory lock on PostgreSQL) and the upgrade runs in one transaction.
    Raises MigrationError when the database is at a revision this code does not know (a newer tuner
    migrated it); SQLAlchemy errors propagate.
    """
    head = head_revision()
    with engine.connect() as conn:
        current = current_revision(conn)
    if current == head:
        return
    _check_known(current)
    migrate_to(engine, head)


def migrate_to(engine: Engine, revision: str) -> None:
    """Upgrade or downgrade our tables to ``revision`` (a known revision, or "head"), in one transaction,
    serialised as :func:`upgrade_to_head` is.

    On SQLite, foreign keys are switched off for the migration (the store switches them on for every
    connection): Alembic's batch mode rebuilds a table by copying it and dropping the original, and with
    foreign keys on, dropping ``tuner_tasks`` would delete every row of ``tuner_slots`` (ON DELETE CASCADE)
    and null the workers' ``current_task_id``. ``PRAGMA foreign_keys`` does nothing inside a transaction,
    so it is set on the connection before the transaction begins and restored after it ends;
    ``PRAGMA foreign_key_check`` must find our tables consistent before the transaction commits.
    MigrationError for an unknown revision, or when a foreign key is left dangling (nothing is changed).
    """
    target = head_revision() if revision == "head" else revision
    _check_known(target)
    order = [script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()][::-1]
    with _IN_PROCESS, engine.connect() as conn:
        conn = conn.execution_options(**{sqlite.BEGIN_OPTION: "IMMEDIATE"})
        with _sqlite_foreign_keys_off(conn), conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
            current = current_revision(conn)  # another migrator may have run meanwhile
            _check_known(current)
            if current == target:
                return
            if current is None or order.index(target) > order.index(current):
                command.upgrade(alembic_config(conn), target)
            else:
                command.downgrade(alembic_config(conn), target)
            _check_foreign_keys(conn)


@contextmanager
def _sqlite_foreign_keys_off(conn: Connection) -> Iterator[None]:
    """SQLite: foreign keys off on this connection while the block runs (it must begin and end the
    transaction itself), then as they were. Other databases: nothing."""
    if conn.dialect.name != "sqlite":
        yield
        return
    if conn.in_transaction():
        raise MigrationError("SQLite migrations must start outside a transaction (PRAGMA foreign_keys)")
    raw = conn.connection.dbapi_connection
    assert raw is not None
    before = raw.execute("PRAGMA foreign_keys").fetchone()[0]
    raw.execute("PRAGMA foreign_keys = OFF")
    try:
        if raw.execute("PRAGMA foreign_keys").fetchone()[0]:
            raise MigrationError("could not switch SQLite foreign keys off for the migration")
        yield
    finally:
        raw.execute(f"PRAGMA foreign_keys = {'ON' if before else 'OFF'}")


def _check_foreign_keys(conn: Connection) -> None:
    """SQLite: MigrationError when a row of our tables refers to a missing row (checked before commit)."""
    if conn.dialect.name != "sqlite":
        return
    bad = [row for row in conn.exec_driver_sql("PRAGMA foreign_key_check") if str(row[0]).startswith(TABLE_PREFIX)]
    if bad:
        raise MigrationError(f"the migration would leave {len(bad)} dangling foreign key(s), e.g. {tuple(bad[0])}")


def schema_drift(connection: Connection) -> list[Any]:
    """What autogenerate would change to make our tables match db/models.py ([] when they agree).

    Only our tables are compared; Optuna's are ignored by the include filters.
    """
    from alembic.autogenerate import compare_metadata

    from tuner.db.models import Base  # env.py imports the models too; keep this module free of them

    opts = {
        "version_table": VERSION_TABLE,
        "include_name": include_name,
        "include_object": include_object,
        "compare_type": True,
    }
    drift = list(compare_metadata(MigrationContext.configure(connection, opts=opts), Base.metadata))
    if connection.dialect.name == "sqlite":  # autogenerate does not compare AUTOINCREMENT
        for table in Base.metadata.sorted_tables:
            wanted = bool(table.dialect_options["sqlite"]["autoincrement"])
            sql = connection.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table.name,)).scalar()
            if sql is not None and ("AUTOINCREMENT" in sql.upper()) != wanted:
                drift.append(("sqlite_autoincrement", table.name, wanted))
    return drift


def _check_known(revision: str | None) -> None:
    if revision is not None and revision not in known_revisions():
        raise MigrationError(
            f"the database is at migration {revision!r}, unknown to this tuner (migrated by a newer one?)"
        )


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Autogenerate filter on reflected names: only tables with our prefix."""
    if type_ == "table":
        return bool(name) and str(name).startswith(TABLE_PREFIX)
    return True


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Autogenerate filter on objects: only tables with our prefix (and what belongs to them)."""
    if type_ == "table":
        return bool(name) and str(name).startswith(TABLE_PREFIX)
    return True
