"""Timeouts of the store's PostgreSQL connections, from the environment (prefix ``TUNER_DB_``), typed and frozen.

``TUNER_DB_CONNECT_TIMEOUT_S``    seconds to open a connection, TCP and start-up included (default 2; libpq's
                                  minimum is 2).
``TUNER_DB_STATEMENT_TIMEOUT_S``  seconds one statement may run: the server cancels it then (``statement_timeout``)
                                  and, one second later, the client gives up on a connection that does not
                                  answer at all (a partition) by shutting its socket down (default 3).
``TUNER_DB_POOL_TIMEOUT_S``       seconds to wait for a free pooled connection (default 2).

With the defaults a request whose database is partitioned away fails within about 4 s (a pooled connection:
its liveness check, then a new connection; or a statement in flight), so the API answers 503 within 5 s,
and the next request after the partition heals reconnects by itself. SQLite files ignore these settings
(their lock waits are ``busy_timeout``, see :mod:`tuner.db.sqlite`).
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class StoreSettings(BaseSettings):
    """Immutable store timeouts; read once per process (:func:`store_settings`)."""

    model_config = SettingsConfigDict(env_prefix="TUNER_DB_", frozen=True, extra="ignore")

    connect_timeout_s: float = Field(default=2.0, ge=2.0, le=600.0)
    statement_timeout_s: float = Field(default=3.0, gt=0.0, le=86_400.0)
    pool_timeout_s: float = Field(default=2.0, gt=0.0, le=600.0)

    @property
    def statement_deadline_s(self) -> float:
        """When the client abandons a statement the server has not answered (its cancel gets a second)."""
        return self.statement_timeout_s + 1.0


@lru_cache(maxsize=1)
def store_settings() -> StoreSettings:
    return StoreSettings()
