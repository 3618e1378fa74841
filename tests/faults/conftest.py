"""Fixtures of the fault tests: a PostgreSQL database of the test's own (tests/fixtures/faults.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures import databases
from tests.fixtures.faults import FaultDatabase


@pytest.fixture
def fault_db(postgres_sandbox: databases.PostgresSandbox) -> Iterator[FaultDatabase]:
    database = FaultDatabase()
    yield database
    database.drop()
