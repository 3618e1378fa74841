"""Fixtures of the store contract suite: every test runs on SQLite and on PostgreSQL (``db_url``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.fixtures.studies import study_fields
from tuner.db import Store, StudyRecord, get_or_create_study

StudyFactory = Callable[..., StudyRecord]


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    store = Store.open(db_url)
    yield store
    store.close()


@pytest.fixture
def make_study(store: Store) -> StudyFactory:
    """Create (or get) a study in ``store``; keyword arguments as for ``study_fields``."""

    def make(**overrides: Any) -> StudyRecord:
        with store.session() as session:
            return get_or_create_study(session, **study_fields(**overrides))

    return make
