"""SQLite connection settings: pragmas on connect, and BEGIN emitted by us rather than by pysqlite.

pysqlite's legacy transaction handling does not BEGIN before DDL or SAVEPOINT, so migrations would
autocommit statement by statement and savepoints would escape their transaction. We turn it off on
connect and emit ``BEGIN`` from SQLAlchemy's ``begin`` event; a connection whose execution options
carry ``BEGIN_OPTION="IMMEDIATE"`` takes the write lock up front (waiting up to ``busy_timeout``),
which serialises writers instead of failing when a read transaction later tries to write.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import Connection

BUSY_TIMEOUT_S = 30.0
BEGIN_OPTION = "tuner_sqlite_begin"


def install(engine: Engine) -> None:
    """Register the connect and begin hooks on an SQLite engine (before its first connection)."""
    event.listen(engine, "connect", _on_connect)
    event.listen(engine, "begin", _on_begin)


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (_on_begin)
    cursor = dbapi_connection.cursor()
    try:
        # busy_timeout first: switching to WAL may have to wait for another connection's lock.
        cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        _switch_to_wal(cursor)
        cursor.execute("PRAGMA synchronous = NORMAL")  # WAL-safe; may lose the last commits on power loss
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _switch_to_wal(cursor: Any) -> None:
    """``PRAGMA journal_mode = WAL``, retried for up to BUSY_TIMEOUT_S while the database is locked: on a fresh
    file two processes connecting at once race for the first switch, and SQLite may answer the loser "database
    is locked" at once, without its busy handler (seen in CI: two processes migrating one new store). Once the
    file is in WAL mode (persistent) the switch takes no lock."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _on_begin(conn: Connection) -> None:
    mode = conn.get_execution_options().get(BEGIN_OPTION, "DEFERRED")
    conn.exec_driver_sql(f"BEGIN {mode}")


def copy_database(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Copy the SQLite database file ``source`` to ``target`` as one consistent snapshot, through SQLite's
    online backup: a store in WAL mode may hold its latest commits in its ``-wal`` file, which a copy of the
    main file alone loses (a copied store without its tables was seen). The copy is written beside ``target``
    and renamed over it: a failed copy leaves ``target`` as it was. Raises sqlite3.Error when ``source`` is
    not a database (or is missing), ValueError when both name the same file; safe while other processes
    use ``source``."""
    src_path, dst_path = Path(source).resolve(), Path(target).resolve()
    if src_path == dst_path:
        raise ValueError(f"copy_database: {src_path} is both the source and the target")
    fd, tmp = tempfile.mkstemp(prefix=f".{dst_path.name}.", suffix=".copy", dir=dst_path.parent)
    os.close(fd)
    try:
        src = sqlite3.connect(f"{src_path.as_uri()}?mode=ro", uri=True)
        try:
            dst = sqlite3.connect(tmp)
            try:
                src.backup(dst)
            finally:
                dst.close()
        finally:
            src.close()
        os.replace(tmp, dst_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
