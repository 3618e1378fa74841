#!/usr/bin/env bash
# Regenerate the committed chunk-cumsum reports from the committed store (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/../.."
DB=sqlite:///benchmarks/h200/chunk_cumsum.db
TUNER="${PYTHON:-.venv/bin/python} -m tuner.cli"
{
  cat benchmarks/h200/chunk_cumsum_core.head.md
  $TUNER report mamba2_chunk_cumsum --device cuda --db "$DB"
} > benchmarks/h200/chunk_cumsum_core.md
{
  cat benchmarks/h200/chunk_cumsum.head.md
  $TUNER report mamba2_chunk_cumsum mamba2_chunk_cumsum_tilelang --device cuda --db "$DB" \
    --title "Mamba2 chunk cumsum forward on the H200: Triton and TileLang templates vs mamba_ssm"
} > benchmarks/h200/chunk_cumsum.md
