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
    with _IN_PROCESS, engine.connect() as conn:
        conn = conn.execution_options(**{sqlite.BEGIN_OPTION: "IMMEDIATE"})
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
            _check_known(current_revision(conn))  # another migrator may have run meanwhile
            command.upgrade(alembic_config(conn), "head")


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
    return list(compare_metadata(MigrationContext.configure(connection, opts=opts), Base.metadata))


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
