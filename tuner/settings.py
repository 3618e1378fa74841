"""Typed, immutable settings from the environment (prefix ``TUNER_``), via pydantic-settings.

``TUNER_DB_URL``   SQLAlchemy URL of the store; unset → the embedded SQLite file ``$TUNER_HOME/tuner.db``.
``TUNER_HOME``     data directory (default ``$XDG_DATA_HOME/tuner`` or ``~/.local/share/tuner``).
``TUNER_TASK_ATTEMPTS``  distinct workers that must give a task up (their device failed on it) before it may
                   fail (default 3): read by the server when a job is submitted and stored on the job, so
                   that every worker applies the same count.
Command-line options override the environment.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNER_", frozen=True, extra="ignore")

    db_url: str | None = None
    samples: int = 100
    candidate_timeout_s: float = 120.0
    task_attempts: Annotated[int, Field(ge=1)] = 3


@lru_cache(maxsize=1)
def engine_settings() -> EngineSettings:
    return EngineSettings()


def data_home() -> Path:
    """tuner's data directory: ``$TUNER_HOME``, else ``$XDG_DATA_HOME/tuner``, else ``~/.local/share/tuner``
    (the compile cache, the local token; ``tuner.db.engine.default_path`` applies the same rule to the
    default store, as the store imports nothing of the engine). Read at each call: tests change it."""
    home = os.environ.get("TUNER_HOME")
    if home:
        return Path(home).expanduser()
    return Path(os.environ.get("XDG_DATA_HOME") or "~/.local/share").expanduser() / "tuner"


def triton_interpreted() -> bool:
    """Whether Triton runs through its interpreter in this process (``TRITON_INTERPRET=1``, which the CPU
    backend sets for its measurement processes before Triton is imported)."""
    return os.environ.get("TRITON_INTERPRET") == "1"
