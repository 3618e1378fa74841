"""The client tests look up the test template ``fault_vector_scale_tunable`` (registered here for the in-process
servers; worker and server processes get it through TUNER_TEMPLATES, see tests/fixtures/processes.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.fault_templates import TUNABLE_REF
from tests.fixtures.servers import TOKENS, thread_server
from tuner import db, registry
from tuner.api.settings import ApiSettings

NAME = "fault_vector_scale_tunable"


@pytest.fixture(autouse=True)
def _test_template() -> None:
    registry.register(NAME, TUNABLE_REF)


@pytest.fixture
def server(store: db.Store) -> Iterator[str]:
    """A real API server (answer cache off) on the test module's ``store``."""
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False,  # type: ignore[arg-type]
                           best_cache_ttl_s=0)
    with thread_server(settings, store) as base:
        yield base

