"""Timeouts of the store's PostgreSQL connections, from the environment (prefix ``TUNER_DB_``), typed and frozen.

``TUNER_DB_CONNECT_TIMEOUT_S``    seconds to open a connection, TCP and start-up included (default 2; libpq's
                                  minimum is 2).
``TUNER_DB_STATEMENT_TIMEOUT_S``  seconds one statement may run: the server cancels it then (``statement_timeout``)
                                  and, one second later, the client gives up on a connection that does not
                                  answer at all (a partition) by shutting its socket down (default 10).
``TUNER_DB_POOL_TIMEOUT_S``       seconds to wait for a free pooled connection (default 2).

With the defaults a request that starts while its database is partitioned away fails within about 4 s (a
pooled connection's liveness check runs under the connect timeout, then a new connection is tried), so the
API answers 503 within 5 s; a statement already in flight when the partition begins is given up after the
statement timeout plus one second (11 s). The next request after the partition heals reconnects by itself.
SQLite files ignore these settings (their lock waits are ``busy_timeout``, see :mod:`tuner.db.sqlite`).

Why 10 s for the statement timeout (it was 3 s): it only bounds statements that run slowly on a live
server (new requests during a partition are bounded by the connect timeout above), and on a loaded host —
CPUs shared with measurements, fsync and checkpoint stalls, a lock wait behind another worker's claim, a
report reading a large store — legitimate statements can take seconds; a cancelled one is a
:class:`tuner.errors.StoreError` (an API 503, a worker retry) for work that would have succeeded. 10 s
leaves that margin while keeping a stuck statement's deadline (11 s) well inside the default worker lease
(30 s, heartbeat every 5 s), so a heartbeat cut at its deadline is retried at the next beat (16 s after
it began) before the lease runs out. Retries themselves are unchanged (:mod:`tuner.db.retry`).
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
    statement_timeout_s: float = Field(default=10.0, gt=0.0, le=86_400.0)
    pool_timeout_s: float = Field(default=2.0, gt=0.0, le=600.0)

    @property
    def statement_deadline_s(self) -> float:
        """When the client abandons a statement the server has not answered (its cancel gets a second)."""
        return self.statement_timeout_s + 1.0


@lru_cache(maxsize=1)
def store_settings() -> StoreSettings:
    return StoreSettings()
