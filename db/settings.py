"""Timeouts of the store's PostgreSQL connections, from the environment (prefix ``TUNER_DB_``), typed and frozen.

``TUNER_DB_CONNECT_TIMEOUT_S``    seconds to open a connection, TCP and start-up included (default 2; libpq's
                                  minimum is 2).
``TUNER_DB_STATEMENT_TIMEOUT_S``  seconds one statement may run: the server cancels it then (``statement_timeout``)
                                  and, one second later, the client gives up on a connection that does not
                                  answer at all (a partition) by shutting its socket down (default 3).
``TUNER_DB_POOL_TIMEOUT_S``       seconds to wait for a free pooled connection (default 2).

With the defaults a request that starts while its database is partitioned away fails within about 4 s (a
pooled connection's liveness check runs under the connect timeout, then a new connection is tried), so the
API answers 503 within 5 s; a statement, a COMMIT or a ROLLBACK already in flight when the partition begins
is given up after the statement timeout plus one second (4 s), and the server ends a transaction its client
left open after 12 s (:attr:`StoreSettings.idle_in_transaction_s`), releasing its locks. The next request
after the partition heals reconnects by itself.
SQLite files ignore these settings (their lock waits are ``busy_timeout``, see :mod:`tuner.db.sqlite`).

Why 3 s for the statement timeout (and not more): a worker's heartbeat thread renews its lease and then
records its Optuna trials' heartbeats in one beat, every ``heartbeat_s`` (5 s); a trial silent for its grace
(4 beats, 20 s: :func:`tuner.driver.study.trial_heartbeats`) is failed as stale by the next worker that asks
for a trial, and its config measured again. A beat stuck in a statement until the deadline delays the trial
heartbeats by up to two intervals plus the deadline: 2 × 5 + 4 = 14 s, inside the 20 s grace and the 30 s
lease. A 10 s timeout (11 s deadline: 21 s) would let one slow statement get a live trial failed
(tests/db/test_store_engine.py pins the inequality for the defaults). A slower statement is a
:class:`tuner.errors.StoreError`: an API 503 or a worker retry. Retries are :mod:`tuner.db.retry`'s.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class StoreSettings(BaseSettings):
    """Immutable store timeouts; read once per process (:func:`store_settings`)."""

    model_config = SettingsConfigDict(env_prefix="TUNER_DB_", frozen=True, extra="ignore")

    connect_timeout_s: float = Field(default=2.0, ge=2.0, le=600.0)
    # Bounded: a value that is not a positive number of seconds fails when the settings are read (once).
    statement_timeout_s: float = Field(default=3.0, gt=0.0, le=86_400.0)
    pool_timeout_s: float = Field(default=2.0, gt=0.0, le=600.0)

    @property
    def statement_deadline_s(self) -> float:
        """When the client abandons a statement, a COMMIT or a ROLLBACK the server has not answered (its
        cancel gets a second)."""
        return self.statement_timeout_s + 1.0

    @property
    def idle_in_transaction_s(self) -> float:
        """When the server ends a session whose transaction has waited that long for its next statement
        (``idle_in_transaction_session_timeout``): a client that went away between a statement and its COMMIT
        (a partition, a host that died) holds its row locks until then, and a worker's row lock held that
        way would hide it from the reaper of lost workers. No transaction of the store waits for its client
        between statements: each is one method's statements. Three statement deadlines, at least 10 s."""
        return max(10.0, 3.0 * self.statement_deadline_s)


@lru_cache(maxsize=1)
def store_settings() -> StoreSettings:
    return StoreSettings()
