"""benchmarks/sm90_resources.py compiles a template's Triton kernels for sm_90 on a host without a GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_reports_registers_of_every_kernel_a_config_launches() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "benchmarks/sm90_resources.py", "mamba2_chunk_cumsum", "--workload",
         "mamba2-780m-b1-s4k", "--config", "{}", "--config", '{"num_warps": 8}'],
        capture_output=True, text=True, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, timeout=600,
    )
    assert run.returncode == 0, run.stderr
    rows = re.findall(r"chunk_cumsum_kernel\s+REG\s+(\d+)\s+STACK\s+(\d+)\s+SHARED\s+(\d+)", run.stdout)
    assert len(rows) == 2, run.stdout
    for regs, stack, _shared in rows:
        assert 16 <= int(regs) <= 255 and int(stack) >= 0
