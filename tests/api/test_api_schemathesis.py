"""schemathesis against a live server: generated requests (valid and invalid) for every operation of the
OpenAPI document, on SQLite and PostgreSQL, with and without a submit token. No answer may be a 5xx, and
every answer must match the document (status code, content type, headers, body schema).

Bounded (``MAX_EXAMPLES`` per operation and phase) so that the four runs take a few minutes on two cores.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.servers import SUBMIT, TOKENS, thread_server
from tuner import db
from tuner.api.settings import ApiSettings

NAME = "fault_vector_scale_tunable"
MAX_EXAMPLES = 10
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance")


@pytest.mark.slow
@pytest.mark.parametrize("token", [SUBMIT, None], ids=["submit-token", "no-token"])
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_generated_requests_get_no_5xx_and_answers_match_the_schema(
    backend: str, token: str | None, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from tests.fixtures.fault_templates import TUNABLE_REF
    from tuner import registry

    registry.register(NAME, TUNABLE_REF)
    if backend == "sqlite":
        url = db.sqlite_url(tmp_path / "t.db")
    else:
        url = request.getfixturevalue("postgres_sandbox").new_url()
    store = db.Store.open(url)
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert cli is not None, "schemathesis is a dev dependency (pyproject.toml)"
    with thread_server(settings, store) as base:
        command = [cli, "run", f"{base}/openapi.json", "--checks", ",".join(CHECKS),
                   "--max-examples", str(MAX_EXAMPLES), "--seed", "14", "--workers", "1",
                   "--generation-database", "none", "--suppress-health-check", "all", "--no-color",
                   "--request-timeout", "30"]
        if token is not None:
            command += ["-H", f"Authorization: Bearer {token}"]
        run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    store.close()
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    counts = re.search(r"Test cases:\s+(\d+) generated, (\d+) passed\s", run.stdout)
    assert counts and int(counts[1]) == int(counts[2]) > 100, run.stdout[-4000:]
