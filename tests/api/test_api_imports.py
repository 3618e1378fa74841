"""The API process is torch-free: importing the app and serving every /v1 read loads none of torch, Triton,
TileLang or Optuna (it reads template specs, never the kernel implementations). Checked in a fresh process,
through sys.modules, with a published best config in the store so that /v1/best takes its full path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "triton", "tilelang", "optuna")

SCRIPT = """
import json, sys
import tuner.api.main
from fastapi.testclient import TestClient
from tests.fixtures.studies import study_fields
from tuner import db
from tuner.api.main import create_app
from tuner.api.settings import ApiSettings
from tuner.store import NewMeasurement

store = db.Store.open("sqlite:///" + sys.argv[1])
study = store.get_or_create_study(**study_fields())  # mamba2_chunk_cumsum, mamba2-780m-b1-s4k
m = store.record_measurement(NewMeasurement(study_id=study.id, role="final", candidate="config",
                                            config_json={"BLOCK_H": 4}, status="OK", median_us=3.0))
store.publish_best(study_id=study.id, measurement_id=m.id)
shape = "B=1&S=4096&H=48&dtype=fp16"
reads = [
    "/v1/templates", "/v1/templates/mamba2_chunk_cumsum", "/v1/templates/mamba3_mimo_bwd",
    "/v1/templates/mamba2_chunk_cumsum_tilelang",
    "/v1/best?template=mamba2_chunk_cumsum&device=cuda&B=1&S=4096&H=48",
    "/v1/best?template=mamba3_mimo_bwd&device=cuda&B=4&S=2048&H=16&N=64&P=64&R=4",
    "/v1/history?template=mamba2_chunk_cumsum&device=cuda&B=1&S=4096&H=48",
    "/v1/jobs", "/v1/jobs/1", "/v1/workers", "/healthz", "/readyz",
]
codes = {}
with TestClient(create_app(ApiSettings(), store)) as client:
    for url in reads:
        codes[url] = client.get(url).status_code
print(json.dumps({"codes": codes, "loaded": [m for m in HEAVY if m in sys.modules]}))
""".replace("HEAVY", repr(HEAVY))


def test_serving_every_read_loads_no_kernel_library_and_no_optuna(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TUNER_TEMPLATES"}  # the built-in templates only
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "t.db")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert all(code < 500 for code in result["codes"].values()), result["codes"]
    assert result["codes"]["/v1/best?template=mamba2_chunk_cumsum&device=cuda&B=1&S=4096&H=48"] == 200
    assert result["codes"]["/v1/templates"] == 200 and result["codes"]["/v1/jobs/1"] == 404
    assert result["loaded"] == [], f"the API process imported {result['loaded']}"
