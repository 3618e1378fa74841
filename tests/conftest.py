"""Fixtures shared by every test package; the logic lives in tests/fixtures/ (plain functions)."""

from __future__ import annotations

import os

# Triton decides between compiling and interpreting when it is first imported, and the first test module
# to import it may live anywhere in the tree: without a CUDA device, every Triton kernel of the suite runs
# under the interpreter. An explicit TRITON_INTERPRET (0 on a GPU host for `-m gpu`) wins.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"

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


@pytest.fixture(scope="session")
def recorded_sweep(tmp_path_factory: pytest.TempPathFactory) -> str:
    """URL of a store holding a small exhaustive CPU sweep (tests/fixtures/recorded.py), made once per session."""
    from tests.fixtures.recorded import record_sweep

    url = databases.sqlite_file_url(tmp_path_factory.mktemp("record") / "record.db")
    record_sweep(url)
    return url
