#!/usr/bin/env bash
# The Mamba3 MIMO backward benchmark in two device calls on one warm machine (each call ≤ 10 minutes):
#   warm  OUTDIR  fill TileLang's and Triton's compile caches for every workload (warm_mimo.py), then probe
#                 the default and seed configs and the TileLang comparator per kernel on two shapes
#   tune  OUTDIR  sweep every workload (tune_mimo.sh) into the store .bench/mamba3_mimo_bwd.db, which starts
#                 as a copy of the committed benchmarks/h200/mamba3_mimo_bwd.db and stays on the machine
# Everything a phase writes is packed into OUTDIR/<phase>.tar.xz (the device tool returns at most 8 files).
# Bundle: ../shared/tools/gpu-bundle DIR --tilelang mamba; PYTHONPATH=<site>:$PWD TRITON_INTERPRET=0.
set -uo pipefail
PHASE=${1:?phase}; OUT=${2:?outdir}
WORK=$(mktemp -d); cd "$(dirname "$0")/../.."
export COLUMNS=220 TL_LOG_LEVEL=${TL_LOG_LEVEL:-WARNING} PYTHONUNBUFFERED=1
mkdir -p .bench
[[ -f .bench/mamba3_mimo_bwd.db ]] || cp benchmarks/h200/mamba3_mimo_bwd.db .bench/mamba3_mimo_bwd.db
case $PHASE in
  warm)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$WORK/gpu.txt"
    date -u +"%Y-%m-%dT%H:%M:%SZ" | tee -a "$WORK/gpu.txt"
    timeout "${WARM_TIMEOUT:-400}" python3 benchmarks/h200/warm_mimo.py --workers 16 \
      --timeout "$(( ${WARM_TIMEOUT:-400} - 10 ))" > "$WORK/warm_mimo.log" 2>&1
    grep -v -E " ok " "$WORK/warm_mimo.log" | tail -20
    python3 - <<'PY' > "$WORK/configs.txt"
from tuner import registry
space = registry.get("mamba3_mimo_bwd").space()
for c in (space.default, *space.seeds):
    print(c.to_json())
print("tilelang")
PY
    mapfile -t CONFIGS < "$WORK/configs.txt"
    timeout "${PROBE_TIMEOUT:-150}" python3 benchmarks/h200/mimo_probe.py \
      --workloads ${PROBE_WORKLOADS:-mimo-n128-p64-r4 mimo-n64-p64-r4} --configs "${CONFIGS[@]}" \
      --samples 10 --workers 16 --timeout "$(( ${PROBE_TIMEOUT:-150} - 40 ))" --json "$WORK/probe.json" \
      > "$WORK/probe.log" 2>&1
    sed -n '/^workload /,$p' "$WORK/probe.log" | cut -c1-230
    ;;
  tune)
    date -u +"%Y-%m-%dT%H:%M:%SZ" | tee "$WORK/date.txt"
    DB="sqlite:///$PWD/.bench/mamba3_mimo_bwd.db" TUNE_TIMEOUT=${TUNE_TIMEOUT:-540} WARM_TIMEOUT=0 \
      bash benchmarks/h200/tune_mimo.sh "${TRIALS:-8}" "$WORK" ${WORKLOADS:-}
    cp .bench/mamba3_mimo_bwd.db "$WORK/"
    python3 -m tuner.cli report mamba3_mimo_bwd --device cuda --errors --db "sqlite:///$PWD/.bench/mamba3_mimo_bwd.db" \
      | tee "$WORK/report_errors.md" | head -40
    ;;
  *) echo "unknown phase $PHASE" >&2; exit 2 ;;
esac
mkdir -p "$OUT"; tar -cJf "$OUT/$PHASE.tar.xz" -C "$WORK" .
