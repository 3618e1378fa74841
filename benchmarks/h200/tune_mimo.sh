#!/usr/bin/env bash
# Mamba3 MIMO backward on the H200: warm the compile caches in parallel, then tune the Triton template with
# mamba_ssm's TileLang backward measured in every final round.
#
# usage: benchmarks/h200/tune_mimo.sh TRIALS OUTDIR [WORKLOAD ...]   (default: the 11 official workloads)
#   The bundle must carry tilelang 0.1.8 (../shared/tools/gpu-bundle DIR --tilelang mamba), with
#   PYTHONPATH=/tmp/site:$PWD TRITON_INTERPRET=0. DB=sqlite:///… picks the store (default OUTDIR's file);
#   WARM_TIMEOUT / TUNE_TIMEOUT bound the two phases in seconds (WARM_TIMEOUT=0 skips the warm-up).
set -euo pipefail
TRIALS=${1:?trials}; OUTDIR=${2:?outdir}; shift 2
mkdir -p "$OUTDIR"
DB=${DB:-"sqlite:///$(cd "$OUTDIR" && pwd)/mamba3_mimo_bwd.db"}
if [[ $# -gt 0 ]]; then
  SELECT=(); for w in "$@"; do SELECT+=(--workload "$w"); done; WARM=(--workloads "$@")
else
  SELECT=(--all-workloads); WARM=()
fi
export COLUMNS=${COLUMNS:-220}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$OUTDIR/gpu_mimo.txt"
date -u +"%Y-%m-%dT%H:%M:%SZ" | tee -a "$OUTDIR/gpu_mimo.txt"
if (( ${WARM_TIMEOUT:-300} > 0 )); then  # 0: the caches are warm already (mimo_session.sh warm)
  python3 benchmarks/h200/warm_mimo.py --workers 16 --timeout "${WARM_TIMEOUT:-300}" "${WARM[@]}" 2>&1 \
    | tee -a "$OUTDIR/warm_mimo.log" | tail -3 || true
fi
timeout "${TUNE_TIMEOUT:-3600}" python3 -m tuner.cli tune mamba3_mimo_bwd "${SELECT[@]}" --trials "$TRIALS" \
  --samples 30 --finalists 3 --timeout 240 --device cuda --seed 0 --db "$DB" 2>&1 \
  | tee -a "$OUTDIR/tune_mimo.log" | grep -E "measured trials|best config for|no config" || true
python3 -m tuner.cli report mamba3_mimo_bwd --device cuda --db "$DB" -o "$OUTDIR/report_mimo.md"
