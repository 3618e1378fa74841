"""Optuna's side of the database: its RDB storage on our URL, and the one write we make to its tables.

Optuna keeps its studies and trials in the same database as ours (so that ``optuna-dashboard <url>`` shows
them) and migrates its own tables; we never migrate them. The only statement we run on them is the
conditional withdrawal of queued trials (:func:`withdraw_waiting`), which Optuna's storage API cannot
express: its state setter fails a trial whatever its current state, and a trial another worker has just
popped must keep running.
"""

from __future__ import annotations

import datetime
import inspect
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session

from tuner.store.protocols import TrialHeartbeats

if TYPE_CHECKING:
    import optuna

    from tuner.db.engine import Store


def rdb_storage(store: Store, heartbeats: TrialHeartbeats | None) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage in the store's database.

    On SQLite its connections get ``synchronous=NORMAL`` (safe under WAL, which the store has switched the
    file to): Optuna commits once per user attribute, and a full fsync per commit made the per-trial
    overhead several times larger than the 50 ms target. With ``heartbeats``, trials carry heartbeats and
    stale ones are retried (Optuna's retry callback) with the same parameters. Optuna's tables are created
    under the store's schema lock. Raises StoreError when the database cannot be reached for the lock;
    Optuna's own errors propagate.
    """
    import optuna

    extra: dict[str, Any] = {}
    # Optuna's heartbeat arguments and retry callback are "experimental": a warning per storage (one per study
    # a worker opens) unless filtered, for the callback's class and the storage's constructor alike.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        if heartbeats is not None:
            # Optuna 4.9 renamed the stale-trial callback (argument and class); older releases know the old names.
            params = inspect.signature(optuna.storages.RDBStorage).parameters
            callback = "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in params \
                else "failed_trial_callback"
            retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) \
                or optuna.storages.RetryFailedTrialCallback
            extra = {
                "heartbeat_interval": heartbeats.interval_s,
                "grace_period": heartbeats.grace_s,
                callback: retry(max_retry=heartbeats.max_retry),
            }
        # Optuna creates its tables on first use, racing other starters on a fresh database (duplicate-key or
        # "table already exists" errors): one process at a time, under the store's schema lock.
        with store.schema_lock():
            storage = optuna.storages.RDBStorage(store.optuna_url, **extra)
    store.guard(storage.engine)  # the store's client-side deadlines on PostgreSQL
    if store.dialect == "sqlite":
        event.listen(storage.engine, "connect", _sqlite_synchronous_normal)
        storage.engine.dispose()  # connections opened before the listener existed
    return storage


@contextmanager
def optuna_errors(store: Store) -> Iterator[None]:
    """Reads of Optuna's storage outside a worker (the API's importance view): its storage errors (Optuna's
    StorageInternalError, SQLAlchemy's own where Optuna does not wrap them) become StoreError, as the store's
    own are translated, so that the API answers 503 and never a bare 500. Other exceptions pass unchanged."""
    import optuna

    from tuner.db.engine import describe
    from tuner.errors import StoreError

    try:
        yield
    except (optuna.exceptions.StorageInternalError, sa.exc.SQLAlchemyError) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, sa.exc.SQLAlchemyError) else exc
        raise StoreError(f"store {store.url}: {describe(cause)}") from exc


def withdraw_waiting(session: Session, trial_ids: Sequence[int]) -> set[int]:
    """Fail those of ``trial_ids`` still WAITING in Optuna's ``trials`` table (one conditional UPDATE per
    trial, in the caller's transaction); returns the ids failed."""
    from optuna.trial import TrialState

    state = sa.Enum(TrialState, name="trialstate")  # Optuna's column: a native enum on PostgreSQL
    trials = sa.table("trials", sa.column("trial_id"), sa.column("state", state), sa.column("datetime_complete"))
    now = datetime.datetime.now()  # Optuna stores naive local times
    withdrawn: set[int] = set()
    for trial_id in trial_ids:
        result = session.execute(
            sa.update(trials)
            .where(trials.c.trial_id == trial_id, trials.c.state == TrialState.WAITING)
            .values(state=TrialState.FAIL, datetime_complete=now)
        )
        if result.rowcount:  # type: ignore[attr-defined]
            withdrawn.add(trial_id)
    return withdrawn


def _sqlite_synchronous_normal(dbapi_connection: Any, _record: object) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA synchronous = NORMAL")
    finally:
        cursor.close()
