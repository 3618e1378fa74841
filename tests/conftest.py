"""Fixtures shared by every test package; the logic lives in tests/fixtures/ (plain functions)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures import databases


@pytest.fixture(scope="session")
def postgres_sandbox() -> Iterator[databases.PostgresSandbox]:
    """A throwaway PostgreSQL database for this test session; skips if the server is unreachable."""
    reason = databases.postgres_unreachable(databases.postgres_url())
    if reason is not None:
        pytest.skip(reason)
    sandbox = databases.PostgresSandbox(databases.postgres_url())
    yield sandbox
    sandbox.close()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an empty database, once per backend: an SQLite file, and a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return databases.sqlite_file_url(tmp_path / "tuner.db")
    sandbox: databases.PostgresSandbox = request.getfixturevalue("postgres_sandbox")
    return sandbox.new_url()
