#!/usr/bin/env bash
# Mamba3 MIMO backward on the H200: warm the compile caches in parallel, then tune the Triton template over
# the 11 official workloads with mamba_ssm's TileLang backward measured in every final round.
#
# usage: benchmarks/h200/tune_mimo.sh TRIALS OUTDIR      (the bundle must carry tilelang 0.1.8:
#        ../shared/tools/gpu-bundle DIR --tilelang mamba; then PYTHONPATH=/tmp/site:$PWD TRITON_INTERPRET=0)
set -euo pipefail
TRIALS=${1:?trials}; OUTDIR=${2:?outdir}
mkdir -p "$OUTDIR"
DB="sqlite:///$(cd "$OUTDIR" && pwd)/mamba3_mimo_bwd.db"
export COLUMNS=${COLUMNS:-220}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUTDIR/gpu_mimo.txt"
date -u +"%Y-%m-%dT%H:%M:%SZ" | tee -a "$OUTDIR/gpu_mimo.txt"
python3 benchmarks/h200/warm_mimo.py --workers 16 --timeout "${WARM_TIMEOUT:-300}" 2>&1 | tee "$OUTDIR/warm_mimo.log" | tail -3 || true
timeout "${TUNE_TIMEOUT:-3600}" python3 -m tuner.cli tune mamba3_mimo_bwd --all-workloads --trials "$TRIALS" --samples 30 --finalists 3 \
  --timeout 240 --device cuda --seed 0 --db "$DB" 2>&1 | tee "$OUTDIR/tune_mimo.log" | grep -E "measured trials|best config for|no config" || true
python3 -m tuner.cli report mamba3_mimo_bwd --device cuda --db "$DB" -o "$OUTDIR/report_mimo.md"
