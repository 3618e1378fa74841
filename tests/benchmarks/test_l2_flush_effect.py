"""benchmarks/l2_flush_effect.py: its table on rows as measure() returns them, and (GPU) a short real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from l2_flush_effect import FLUSHES, table  # noqa: E402


def test_table_compares_with_the_fastest_template_config() -> None:
    row = {
        "workload": "mamba2-2p7b-b2-s32k-dt-bias", "bytes": 52_428_800, "flush": "zero",
        "tilelang_us": {"tilelang {}": 17.6, 'tilelang {"min_blocks":8}': 16.0},
        "copy_us": 16.8, "mamba_ssm_us": 20.0, "mamba_ssm_line": "mamba_ssm-bh8",
    }  # fmt: skip
    lines = table([row]).splitlines()
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:5] == ["mamba2-2p7b-b2-s32k-dt-bias", "52.4", "zero", "17.60", "16.00"]
    assert cells[5:] == ["20.00 (mamba_ssm-bh8)", "16.80", "1.05", "1.25x"]  # ratios to 16.0, the fastest


def _measure(tmp_path: Path, *args: str) -> list[dict]:
    """Run the script on the GPU with ``args`` (5 samples) and return its JSON rows; skipped without CUDA."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    out = tmp_path / "rows.json"
    # the checkout first, then what the caller's path holds (on the GPU machine: the bundled packages)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    run = subprocess.run(
        [sys.executable, "benchmarks/l2_flush_effect.py", "--samples", "5", "--json", str(out), *args],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": path}, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    rows: list[dict] = json.loads(out.read_text())
    return rows


@pytest.mark.gpu
@pytest.mark.slow
def test_measures_every_workload_under_every_flush(tmp_path: Path) -> None:
    rows = _measure(tmp_path)
    assert [r["flush"] for r in rows[:3]] == list(FLUSHES) and len(rows) == 5 * len(FLUSHES)
    assert all(r["copy_us"] > 0 and min(r["tilelang_us"].values()) > 0 for r in rows)


@pytest.mark.gpu
@pytest.mark.slow
def test_measures_the_shapes_and_flushes_asked_with_parallel_builds(tmp_path: Path) -> None:
    shapes = ["B=1,S=4096,H=48,has_bias=true,dtype=float16", "B=1,S=2048,H=24,has_bias=false,dtype=float32"]
    rows = _measure(tmp_path, "--flush", "zero", "--jobs", "2", "--config", "{}", "--config", '{"min_blocks":8}',
                    *[a for s in shapes for a in ("--shape", s)])
    assert [r["workload"] for r in rows] == ["mamba2-780m-b1-s4k-dt-bias",  # a workload's shape keeps its name
                                             "B=1,H=24,Q=256,S=2048,dtype=float32,has_bias=false,softplus=true"]
    assert [r["flush"] for r in rows] == ["zero", "zero"]
    assert all(len(r["tilelang_us"]) == 2 and min(r["tilelang_us"].values()) > 0 for r in rows)
