"""The store handle: one SQLAlchemy engine per database, sessions per call, errors translated once.

Where the default database lives: ``Store.open(None)`` uses the SQLite file ``$TUNER_HOME/tuner.db``;
``TUNER_HOME`` defaults to ``$XDG_DATA_HOME/tuner``, and ``XDG_DATA_HOME`` to ``~/.local/share`` (so
``~/.local/share/tuner/tuner.db`` on a bare system). The directory is created on open.

Any other SQLAlchemy URL works (PostgreSQL via ``postgresql+psycopg://user:pass@host:5432/db``). On
open the store checks that the database answers and migrates its own tables (prefix ``tuner_``, version
table ``tuner_alembic_version``) to the newest revision; Optuna's tables in the same database are left
alone. PostgreSQL connections get connect, statement and pool timeouts (:mod:`tuner.db.settings`) and
client-side deadlines (:mod:`tuner.db.deadline`), so that an unreachable or partitioned database fails a call
within seconds instead of hanging it.

SQLite connections get ``busy_timeout`` (30 s), WAL journal, ``synchronous=NORMAL`` and foreign keys
on, and write sessions take the write lock up front (``BEGIN IMMEDIATE``; see :mod:`tuner.db.sqlite`).
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, unquote_to_bytes, urlsplit

import filelock
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from tuner.db import deadline, migrate, sqlite
from tuner.db.methods import StoreMethods
from tuner.db.settings import StoreSettings, store_settings
from tuner.errors import RecordConflictError, RecordRejectedError, StoreError

log = logging.getLogger(__name__)
# Key of the session-level PostgreSQL advisory lock around schema creation ("tunerS" in ASCII); our
# migrations take another key (db.migrate), so a starter holding this one can migrate without a deadlock.
SCHEMA_LOCK_KEY = 0x74756E657253
_SCHEMA_LOCK_IN_PROCESS = threading.RLock()


def default_path() -> Path:
    """``$TUNER_HOME/tuner.db`` (see the module docstring); pure, creates nothing."""
    home = os.environ.get("TUNER_HOME")
    if home:
        return Path(home).expanduser() / "tuner.db"
    data = os.environ.get("XDG_DATA_HOME") or str(Path("~/.local/share").expanduser())
    return Path(data).expanduser() / "tuner" / "tuner.db"


def sqlite_url(path: str | os.PathLike[str]) -> str:
    """The SQLAlchemy URL of an SQLite file (made absolute), whatever characters its path holds.

    A plain ``sqlite:////abs/path`` URL is used when it names the file; a path holding ``?``, ``#`` or
    ``%`` (which SQLAlchemy would read as a query, a fragment or an escape) becomes an SQLite URI filename
    (``sqlite:///file:…?uri=true``, its path percent-escaped twice: SQLAlchemy undoes one, SQLite the
    other). :func:`sqlite_file` reads either form back."""
    resolved = Path(path).expanduser().resolve()
    if not any(ch in str(resolved) for ch in "?#%"):
        return f"sqlite:///{resolved}"
    return f"sqlite:///{quote(resolved.as_uri(), safe=':/')}?uri=true"


def sqlite_file(url: str | URL) -> Path | None:
    """The file an SQLite URL names (either form :func:`sqlite_url` writes), or None for another database,
    an in-memory one or a URL SQLAlchemy cannot parse."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except Exception:
        return None
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or database in (None, "", ":memory:"):
        return None
    if str(parsed.query.get("uri", "")).lower() in ("true", "1", "yes", "on") and database.startswith("file:"):
        # An SQLite URI filename: its own parameters sit in the URL's query (mode=memory there, or in the
        # database string when its "?" was escaped); an in-memory one names no file.
        location = urlsplit(database)
        if parsed.query.get("mode") == "memory" or "mode=memory" in location.query or location.path == ":memory:":
            return None
        return Path(os.fsdecode(unquote_to_bytes(location.path)))
    return Path(database)


def default_url() -> str:
    """The URL ``Store.open(None)`` uses: :func:`sqlite_url` of :func:`default_path`."""
    return sqlite_url(default_path())


def mask_url(url: str | URL) -> str:
    """The URL with its password replaced by ``***`` (also for strings SQLAlchemy cannot parse)."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # unparsable: mask anything between "user:" and "@"
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def describe(exc: BaseException) -> str:
    """One line naming an exception's class and first message line (DB-API cause preferred)."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    first = lines[0] if lines else ""
    return f"{type(cause).__name__}: {first}" if first else type(cause).__name__


class Store(StoreMethods):
    """A database holding tuner's tables; share one instance across threads.

    Implements the engine's store protocols (:class:`tuner.store.TuningStore`, :class:`tuner.store.JobQueue`:
    one transaction per method, see :mod:`tuner.db.methods`); :meth:`session` is the transaction scope
    those methods and the repository functions share.

    Thread-safe: one engine (connection pool) per store, and every :meth:`session` call opens its own
    session. Fork-safe: a forked child starts with an empty pool and never touches the parent's
    connections (a spawned child opens its own store). Every SQLAlchemy error that crosses
    this class is raised as :class:`tuner.errors.StoreError` with the masked URL and the cause.
    """

    def __init__(self, engine: Engine, settings: StoreSettings | None = None) -> None:
        """Wrap an engine built by :meth:`open` (use ``open``; this neither checks nor migrates)."""
        self._engine = engine
        self.settings = settings or store_settings()
        self._url = engine.url
        self._write = sessionmaker(
            bind=engine.execution_options(**{sqlite.BEGIN_OPTION: "IMMEDIATE"}), expire_on_commit=False
        )
        self._read = sessionmaker(bind=engine, expire_on_commit=False)
        _dispose_in_forked_children(engine)

    @classmethod
    def open(cls, url: str | None = None, *, migrate_schema: bool = True,
             settings: StoreSettings | None = None) -> Store:
        """Connect to ``url`` (None: :func:`default_url`), check it answers, migrate our tables to head.

        Raises StoreError (one line: masked URL + cause) for a malformed URL, an unknown or missing
        driver, an unreachable or refusing database (PostgreSQL gives up after ``connect_timeout_s``),
        or a database migrated by a newer tuner than this one. ``settings``: default :func:`store_settings`.
        """
        settings = settings or store_settings()
        if url is None:
            path = default_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            url = sqlite_url(path)
        try:
            engine = _create_engine(url, settings)
        except (SQLAlchemyError, ImportError, ValueError, TypeError) as exc:
            raise StoreError(f"cannot open store {mask_url(url)}: {describe(exc)}") from exc
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            if migrate_schema:
                migrate.upgrade_to_head(engine)
        except (SQLAlchemyError, migrate.MigrationError) as exc:
            engine.dispose()
            raise StoreError(f"cannot open store {mask_url(engine.url)}: {describe(exc)}") from exc
        return cls(engine, settings)

    @property
    def url(self) -> str:
        """The database URL with the password masked (safe to log)."""
        return mask_url(self._url)

    @property
    def dialect(self) -> str:
        """SQLAlchemy dialect name: ``sqlite``, ``postgresql``…"""
        return self._engine.dialect.name

    @property
    def engine(self) -> Engine:
        """The engine, for migrations and diagnostics; repository code goes through :meth:`session`."""
        return self._engine

    @property
    def optuna_url(self) -> str:
        """The URL (with password) Optuna's RDBStorage should use: the same database as ours."""
        return optuna_storage_url(self)

    def unmasked_url(self) -> str:
        """The full URL including the password (do not log it)."""
        return self._url.render_as_string(hide_password=False)

    @contextmanager
    def session(self, *, readonly: bool = False) -> Iterator[Session]:
        """One transaction: commit when the block ends, rollback when it raises.

        Errors are translated here, once: the database refusing a value as data (out of range, NUL or an
        unencodable character in text, too long) is RecordRejectedError, and a broken constraint (a
        duplicate key) RecordConflictError: the caller's input, retrying will not help. Every other
        SQLAlchemyError raised in the block, at commit or at rollback (unreachable, refusing, timed out)
        becomes a StoreError. Other exceptions pass through unchanged after the rollback. Do not call
        ``commit`` inside.
        ``readonly=True`` promises the block will not write: on SQLite it then starts a deferred
        transaction that does not wait for the write lock (writing in it may fail with "locked").
        """
        maker = self._read if readonly else self._write
        try:
            with maker() as session, session.begin():
                yield session
        except DataError as exc:
            raise RecordRejectedError(f"the store refused a value: {describe(exc)}") from exc
        except IntegrityError as exc:
            raise RecordConflictError(f"the store refused a write: {describe(exc)}") from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"store {self.url}: {describe(exc)}") from exc
        except (OverflowError, UnicodeEncodeError) as exc:  # raised by sqlite3 while binding, not wrapped
            raise RecordRejectedError(f"the store refused a value: {type(exc).__name__}: {exc}") from exc

    @contextmanager
    def schema_lock(self, timeout_s: float = 300.0) -> Iterator[None]:
        """Hold the store's schema lock for the block: one process at a time creates tables (Optuna's,
        whose creation is not safe against concurrent starters), the others wait, then find them there.

        PostgreSQL: a session-level advisory lock on a connection of its own; an SQLite file: an OS file
        lock on ``<file>.schema-lock`` beside it (the ``filelock`` library); always a lock within this
        process too. Raises StoreError when the database cannot be reached or the lock is not had
        within ``timeout_s``.
        """
        with _SCHEMA_LOCK_IN_PROCESS:
            if self.dialect == "postgresql":
                with self._pg_schema_lock(timeout_s):
                    yield
            elif (file := sqlite_file(self._url)) is not None:
                lock = filelock.FileLock(f"{file}.schema-lock", timeout=timeout_s)
                try:
                    lock.acquire()
                except filelock.Timeout as exc:
                    raise StoreError(f"store {self.url}: schema lock not had within {timeout_s:g} s") from exc
                try:
                    yield
                finally:
                    lock.release()
            else:
                yield

    @contextmanager
    def _pg_schema_lock(self, timeout_s: float) -> Iterator[None]:
        try:
            wait_s = timeout_s + self.settings.statement_deadline_s
            conn = self._engine.connect().execution_options(
                isolation_level="AUTOCOMMIT", **{deadline.DEADLINE_OPTION: wait_s}
            )
            conn.execute(text("SELECT set_config('lock_timeout', :ms, false), "
                              "set_config('statement_timeout', '0', false)"), {"ms": str(round(timeout_s * 1000))})
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
        except SQLAlchemyError as exc:
            raise StoreError(f"store {self.url}: cannot take the schema lock: {describe(exc)}") from exc
        try:
            yield
        finally:
            try:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": SCHEMA_LOCK_KEY})
            except SQLAlchemyError as exc:  # the connection is gone, and the session lock with it
                log.warning("could not release the schema lock of %s: %s", self.url, describe(exc))
            finally:
                conn.invalidate()  # never return a connection with altered timeouts to the pool
                conn.close()

    def guard(self, engine: Engine) -> None:
        """Put another engine on this store's database (Optuna's) under the same deadlines as ours."""
        deadline.guard(engine, self.settings)

    def close(self) -> None:
        """Close pooled connections. Sessions opened later reconnect."""
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.url!r})"


def optuna_storage_url(store: Store) -> str:
    """The URL for ``optuna.storages.RDBStorage``: our database, with a lock wait / connect timeout.

    SQLite gets ``timeout=30`` (Optuna's connections then wait for our writers like ours do);
    PostgreSQL via psycopg gets the store's connect and statement timeouts. Parameters already in the
    URL are kept. (Call :meth:`Store.guard` on the storage's engine for the client-side deadlines.)
    """
    url = store._url
    if url.get_backend_name() == "sqlite" and "timeout" not in url.query:
        url = url.update_query_dict({"timeout": str(int(sqlite.BUSY_TIMEOUT_S))})
    elif _is_libpq(url):
        url = url.update_query_dict(_libpq_args(url, store.settings))
    return url.render_as_string(hide_password=False)


def _libpq_args(url: URL, settings: StoreSettings) -> dict[str, str]:
    """connect_timeout (unless the URL sets one) and the server-side statement_timeout and
    idle_in_transaction_session_timeout (each unless the URL's ``options`` set it), added to the URL's own
    ``options`` (e.g. a ``search_path``)."""
    args: dict[str, str] = {}
    if "connect_timeout" not in url.query:
        args["connect_timeout"] = str(math.ceil(settings.connect_timeout_s))
    options = str(url.query.get("options", ""))
    for name, seconds in (("statement_timeout", settings.statement_timeout_s),
                          ("idle_in_transaction_session_timeout", settings.idle_in_transaction_s)):
        if name not in options:
            options = f"{options} -c {name}={round(seconds * 1000)}".strip()
    if options != url.query.get("options", ""):
        args["options"] = options
    return args


def _dispose_in_forked_children(engine: Engine) -> None:
    # SQLAlchemy's recipe: the child drops the inherited pool without closing the parent's connections.
    # A weak reference, because at-fork hooks cannot be unregistered and must not keep engines alive.
    ref = weakref.ref(engine)

    def after_in_child() -> None:
        alive = ref()
        if alive is not None:
            alive.dispose(close=False)

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=after_in_child)


def _is_libpq(url: URL) -> bool:
    return url.get_backend_name() == "postgresql" and url.get_driver_name() in ("psycopg", "psycopg2")


def _create_engine(url: str, settings: StoreSettings) -> Engine:
    parsed = make_url(url)
    kwargs: dict[str, Any] = {}
    if _is_libpq(parsed):
        parsed = parsed.update_query_dict(_libpq_args(parsed, settings))
        kwargs["pool_timeout"] = settings.pool_timeout_s
    # Liveness of pooled connections: checked under a deadline by db.deadline (libpq drivers), else pre-ping.
    kwargs["pool_pre_ping"] = parsed.get_backend_name() != "sqlite" and not _is_libpq(parsed)
    engine = create_engine(parsed, **kwargs)
    if engine.dialect.name == "sqlite":
        sqlite.install(engine)
    deadline.guard(engine, settings)
    return engine
