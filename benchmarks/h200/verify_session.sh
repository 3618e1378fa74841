#!/usr/bin/env bash
# Issue 15's H200 runs (and issue 17's exhaustive records), in phases of at most ~9 minutes, one device call
# each, on one warm machine. Everything a phase writes goes into OUTDIR/<phase>.tar.xz (the device tool
# returns at most 8 files); stores it updates are also copied to OUTDIR/ on their own.
#
#   cumsum   OUTDIR  fresh final rounds of both chunk-cumsum templates on the five workloads (a few trials more
#                    each, continuing the committed store benchmarks/h200/chunk_cumsum.db: every comparator
#                    line as users call mamba_ssm, its contract variants and the elementwise ceiling), and the
#                    TileLang template on mamba_ssm's contract (fp32 dt_out) for the five shapes
#   verify   OUTDIR  `tuner verify` of the served chunk-cumsum bests (TileLang) on the five workloads, 5 fresh
#                    processes each, then exhaustive subspaces (issue 17) as far as EXH_TIMEOUT allows
#   mimo     OUTDIR  `tuner verify` of the MIMO backward bests (bundle --tilelang mamba) on WORKLOADS
#                    (default: all 11), 5 fresh processes each, after warming the compile caches
# Bundles: ../shared/tools/gpu-bundle .gpu (cumsum, verify) or --tilelang mamba .gpu-mamba (mimo); then
# PYTHONPATH=/tmp/site:$PWD TRITON_INTERPRET=0.
set -uo pipefail
PHASE=${1:?phase}; OUT=${2:?outdir}
cd "$(dirname "$0")/../.."
W=$(mktemp -d); H=benchmarks/h200
export COLUMNS=200 PYTHONUNBUFFERED=1 TL_LOG_LEVEL=${TL_LOG_LEVEL:-WARNING}
TUNER="python3 -m tuner.cli"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$W/gpu.txt"
date -u +"%Y-%m-%dT%H:%M:%SZ" | tee -a "$W/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$W/gpu.txt"
CUMSUM_DB="sqlite:///$PWD/$H/chunk_cumsum.db"
# The five workloads on mamba_ssm's contract: dt_out in fp32, as its wrapper returns it.
FP32=(-s B=1,S=4096,H=48,has_bias=false,dtype=float32 -s B=8,S=2048,H=64,has_bias=false,dtype=float32
      -s B=1,S=4096,H=48,has_bias=true,dtype=float32 -s B=8,S=2048,H=64,has_bias=true,dtype=float32
      -s B=2,S=32768,H=80,has_bias=true,dtype=float32)
step() {  # name timeout command...: run, log to $W/name.log, print the log's summary lines
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date -u +%H:%M:%S))"
  timeout "$limit" "$@" > "$W/$name.log" 2>&1; echo "rc=$?" >> "$W/$name.log"
  grep -E "measured trials|best config for|drift|valid configs|rc=|error|Error" "$W/$name.log" | cut -c1-220 | tail -14
}
case $PHASE in
  cumsum)
    step tune_tilelang 200 $TUNER tune mamba2_chunk_cumsum_tilelang --all-workloads --trials "${TRIALS:-6}" \
      --samples 100 --finalists 3 --device cuda --seed 5 --db "$CUMSUM_DB"
    step tune_tilelang_fp32 200 $TUNER tune mamba2_chunk_cumsum_tilelang "${FP32[@]}" --trials "${FP32_TRIALS:-16}" \
      --samples 100 --finalists 3 --device cuda --seed 5 --db "$CUMSUM_DB"
    step tune_triton 120 $TUNER tune mamba2_chunk_cumsum --all-workloads --trials "${TRITON_TRIALS:-2}" \
      --samples 100 --finalists 2 --device cuda --seed 5 --db "$CUMSUM_DB"
    cp "$H/chunk_cumsum.db" "$OUT/"
    ;;
  verify)
    step verify_cumsum 300 $TUNER verify mamba2_chunk_cumsum_tilelang --all-workloads --processes 5 --samples 100 \
      --device cuda --db "$CUMSUM_DB" --json
    cp "$H/chunk_cumsum.db" "$OUT/"
    # Issue 17: exhaustive subspaces (resumable; a sweep cut short is a uniform sample of its subspace).
    EXH_DB="sqlite:///$PWD/$H/exhaustive_chunk_cumsum.db"
    TL_ONLY=(--only scan=twolevel --only prefix=tree --only store=staged --only pad=1 --only vec=1 --only layout=qh
             --only fast_math=true --only persist=1 --only min_blocks=0 --only load_cache=default
             --only threads=128,256)
    TR_ONLY=(--only layout=rows --only sweep=chunks --only persistent=0 --only hints=false --only num_stages=1
             --only CHUNKS=1,2 --only SPLIT=1,2 --only num_warps=2,4,8)
    step exhaustive_tilelang "${EXH_TL_TIMEOUT:-120}" $TUNER tune mamba2_chunk_cumsum_tilelang \
      -w mamba2-780m-b1-s4k -w mamba2-2p7b-b2-s32k-dt-bias --exhaustive "${TL_ONLY[@]}" --samples 100 \
      --device cuda --no-comparators --db "$EXH_DB"
    step exhaustive_triton "${EXH_TR_TIMEOUT:-120}" $TUNER tune mamba2_chunk_cumsum -w mamba2-780m-b1-s4k \
      -w mamba2-1p3b-b8-s2k-dt-bias -w mamba2-2p7b-b2-s32k-dt-bias --exhaustive "${TR_ONLY[@]}" --samples 100 \
      --device cuda --no-comparators --db "$EXH_DB"
    cp "$H/exhaustive_chunk_cumsum.db" "$OUT/"
    ;;
  mimo)
    SELECT=(); for w in ${WORKLOADS:-}; do SELECT+=(-w "$w"); done
    [[ ${#SELECT[@]} -eq 0 ]] && SELECT=(--all-workloads)
    step warm "${WARM_TIMEOUT:-240}" python3 "$H/warm_mimo.py" --workers 16 --timeout "$(( ${WARM_TIMEOUT:-240} - 10 ))" \
      ${WORKLOADS:+--workloads $WORKLOADS}
    step verify_mimo "${VERIFY_TIMEOUT:-300}" $TUNER verify mamba3_mimo_bwd "${SELECT[@]}" --processes 5 --samples 30 \
      --timeout 240 --device cuda --db "sqlite:///$PWD/$H/mamba3_mimo_bwd.db" --json
    cp "$H/mamba3_mimo_bwd.db" "$OUT/"
    ;;
  *) echo "unknown phase $PHASE" >&2; exit 2 ;;
esac
tar -cJf "$OUT/$PHASE.tar.xz" -C "$W" .
