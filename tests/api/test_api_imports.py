"""The API process is torch-free: importing the app, serving every /v1 read and rendering the exploration
pages load none of torch, Triton, TileLang or Optuna (it reads template specs, never the kernel
implementations). Checked in a fresh process, through sys.modules, with a published best config, a final
round (config, default, a comparator) and sweep trials in the store, so that /v1/best and the template page
take their full path."""

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
for n, (status, us) in enumerate([("OK", 3.5), ("OK", 4.5), ("RUNTIME_ERROR", None)]):
    store.record_measurement(NewMeasurement(study_id=study.id, role="trial", candidate="config", trial_number=n,
                                            config_json={"BLOCK_H": 2 + n}, status=status, median_us=us))
m = store.record_measurement(NewMeasurement(study_id=study.id, role="final", candidate="config", round_id="r1",
                                            config_json={"BLOCK_H": 4}, status="OK", median_us=3.0,
                                            p20_us=2.9, p80_us=3.2))
for candidate, us in (("default", 6.0), ("comparator:mamba_ssm", 4.0)):
    store.record_measurement(NewMeasurement(study_id=study.id, role="final", candidate=candidate, round_id="r1",
                                            config_json={}, status="OK", median_us=us))
store.publish_best(study_id=study.id, measurement_id=m.id)
shape = "B=1&S=4096&H=48&dtype=fp16"
reads = [
    "/v1/templates", "/v1/templates/mamba2_chunk_cumsum", "/v1/templates/mamba3_mimo_bwd",
    "/v1/templates/mamba2_chunk_cumsum_tilelang",
    "/v1/best?template=mamba2_chunk_cumsum&device=cuda&B=1&S=4096&H=48",
    "/v1/best?template=mamba3_mimo_bwd&device=cuda&B=4&S=2048&H=16&N=64&P=64&R=4",
    "/v1/history?template=mamba2_chunk_cumsum&device=cuda&B=1&S=4096&H=48",
    "/v1/jobs", "/v1/jobs/1", "/v1/workers", "/healthz", "/readyz",
    "/", "/ui/templates/mamba2_chunk_cumsum", "/ui/templates/mamba3_mimo_bwd", f"/ui/studies/{study.id}",
    f"/ui/compare?study={study.id}",
]
codes, bodies = {}, {}
with TestClient(create_app(ApiSettings(), store)) as client:
    for url in reads:
        response = client.get(url)
        codes[url] = response.status_code
        bodies[url] = response.text
page = bodies["/ui/templates/mamba2_chunk_cumsum"]
row = page[page.index('id="shapes"'):page.index("</table>", page.index('id="shapes"'))]
print(json.dumps({"codes": codes, "row": row, "loaded": [m for m in HEAVY if m in sys.modules]}))
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
    assert all(result["codes"][url] == 200 for url in result["codes"] if url.startswith(("/ui", "/?")) or url == "/")
    row = result["row"]  # the template page's row: the final round's figures, trials (failed), the comparator
    for text in ("S=4096", "3.00", "6.00", "mamba_ssm µs", "4.00", "3 (1)", "2.00×"):
        assert text in row, (text, row)
    assert result["loaded"] == [], f"the API process imported {result['loaded']}"
