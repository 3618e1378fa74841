#!/usr/bin/env bash
# Tune one chunk-cumsum template over the five workloads on the GPU of this host, with mamba_ssm's kernel
# measured in every final round (same process, interleaved), and write the store, the log and the report.
#
# usage: benchmarks/h200/tune_chunk_cumsum.sh TEMPLATE TRIALS OUTDIR
#   TEMPLATE  mamba2_chunk_cumsum (Triton) | mamba2_chunk_cumsum_tilelang
#   OUTDIR    gets tune_<TEMPLATE>.log and the store chunk_cumsum.db (reused when present: several templates
#             land in one store, so that `tuner report` can put them side by side)
# On the H200 machine (see ../shared/tools/README.md for the package bundle), from the repository root:
#   export PYTHONPATH=/tmp/site:$PWD TRITON_INTERPRET=0
#   bash benchmarks/h200/tune_chunk_cumsum.sh mamba2_chunk_cumsum 60 $OUT
set -euo pipefail
TEMPLATE=${1:?template}; TRIALS=${2:?trials}; OUTDIR=${3:?outdir}
mkdir -p "$OUTDIR"
DB="sqlite:///$(cd "$OUTDIR" && pwd)/chunk_cumsum.db"
export COLUMNS=${COLUMNS:-220}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUTDIR/gpu_$TEMPLATE.txt"
date -u +"%Y-%m-%dT%H:%M:%SZ" | tee -a "$OUTDIR/gpu_$TEMPLATE.txt"
python3 -m tuner.cli tune "$TEMPLATE" --all-workloads --trials "$TRIALS" --samples 100 --finalists 4 \
  --device cuda --seed 0 --db "$DB" 2>&1 | tee "$OUTDIR/tune_$TEMPLATE.log" | grep -E "measured trials|best config for"
python3 -m tuner.cli report "$TEMPLATE" --device cuda --db "$DB" -o "$OUTDIR/report_$TEMPLATE.md"
