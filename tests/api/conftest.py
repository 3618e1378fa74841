"""The API tests serve the test template ``fault_vector_scale_tunable`` (registered here for the in-process
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


@pytest.fixture(scope="module")
def sqlite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, db.Store]]:
    """A real API server in a thread of this process (the test tokens), on a SQLite store of the module's own."""
    registry.register(NAME, TUNABLE_REF)
    store = db.Store.open(db.sqlite_url(tmp_path_factory.mktemp("api") / "t.db"))
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    with thread_server(settings, store) as base:
        yield base, store
