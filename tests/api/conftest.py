"""The API tests serve the test template ``fault_vector_scale_tunable`` (registered here for the in-process
servers; worker and server processes get it through TUNER_TEMPLATES, see tests/fixtures/processes.py)."""

from __future__ import annotations

import pytest

from tests.fixtures.fault_templates import TUNABLE_REF
from tuner import registry

NAME = "fault_vector_scale_tunable"


@pytest.fixture(autouse=True)
def _test_template() -> None:
    registry.register(NAME, TUNABLE_REF)
