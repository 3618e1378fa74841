"""Typed, immutable settings from the environment (prefix ``TUNER_``), via pydantic-settings.

``TUNER_DB_URL``   SQLAlchemy URL of the store; unset → the embedded SQLite file ``$TUNER_HOME/tuner.db``.
``TUNER_HOME``     data directory (default ``$XDG_DATA_HOME/tuner`` or ``~/.local/share/tuner``).
Command-line options override the environment.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic_settings import BaseSettings, SettingsConfigDict


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNER_", frozen=True, extra="ignore")

    db_url: str | None = None
    samples: int = 100
    candidate_timeout_s: float = 120.0


@lru_cache(maxsize=1)
def engine_settings() -> EngineSettings:
    return EngineSettings()
