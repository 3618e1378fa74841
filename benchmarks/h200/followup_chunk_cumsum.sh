#!/usr/bin/env bash
# What issue 4 needs from the H200 beyond the first sweep, in one call: the parallel-compile speed-up of the
# TileLang template on the host's 16 cores (measured 2026-11-29: 4.98x), Nsight Compute profiles of its best
# 2p7b kernel (the row short of 80% of the copy bandwidth) and of the same config as a looping kernel
# (persist), and with RETUNE=1 the templates' sweeps (2026-11-29, third session: both, writing the committed
# store chunk_cumsum.db). Bundle: ../shared/tools/gpu-bundle .gpu (tilelang 0.1.15), then
# PYTHONPATH=/tmp/site:$PWD TRITON_INTERPRET=0.
#
# usage: [COMPILE=0] [PROFILES="best minblocks8 persist4-minblocks5"] [RETUNE=1 [TEMPLATES=…] [DB_FROM=store.db]]
#          benchmarks/h200/followup_chunk_cumsum.sh OUTDIR
#   e.g. the fourth session's call (template version 4's occupancy hint and version 3's one-wave looping
#   kernel, sweeps continuing the committed store): COMPILE=0 PROFILES="best minblocks8 persist5
#   persist4-minblocks5" RETUNE=1 TEMPLATES=mamba2_chunk_cumsum_tilelang DB_FROM=benchmarks/h200/chunk_cumsum.db
#   writes everything into OUTDIR/followup.tar.xz (the device tool returns at most 8 files)
set -uo pipefail
OUT=${1:?outdir}; mkdir -p "$OUT"; W=$(mktemp -d)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$W/gpu.txt"
date -u +"%Y-%m-%dT%H:%M:%SZ" | tee -a "$W/gpu.txt"
# The tuned best config for mamba2-2p7b-b2-s32k-dt-bias (benchmarks/h200/chunk_cumsum.md, 2026-11-29).
BEST='{"block_h":8,"fast_math":true,"layout":"qh","pad":1,"prefix":"tree","rows":1,"scan":"twolevel","store":"staged","sweep":"heads","threads":256,"vec":1}'
if [[ ${COMPILE:-1} == 1 ]]; then  # COMPILE=0 skips the compile-throughput measurement
  timeout 240 python3 benchmarks/compile_throughput.py mamba2_chunk_cumsum_tilelang \
    --workload mamba2-2p7b-b2-s32k-dt-bias --configs "${CONFIGS:-24}" --workers 16 \
    --json "$W/compile_throughput.json" 2>&1 | grep -v TileLang | tee "$W/compile_throughput.log" | tail -4
fi
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1)
if [[ -n $NCU && ${PROFILES:-} != none ]]; then  # PROFILES=none: no profiles
  # the tuned best and variants of it named by dash-joined overrides: persistN (tiles per CTA) and
  # minblocksN (the occupancy hint), e.g. PROFILES="best minblocks8 persist4-minblocks5"
  for NAME in ${PROFILES:-best minblocks8}; do
    CONFIG=${BEST%\}}
    for TOKEN in ${NAME//-/ }; do
      case $TOKEN in
        best) ;;
        persist*) CONFIG+=",\"persist\":${TOKEN#persist}" ;;
        minblocks*) CONFIG+=",\"min_blocks\":${TOKEN#minblocks}" ;;
        *) echo "unknown profile token $TOKEN" >&2; continue 2 ;;
      esac
    done
    CONFIG+="}"
    timeout 150 "$NCU" --clock-control none --target-processes all --kernel-name regex:chunk_cumsum \
      --launch-skip 2 --launch-count 1 --set full -o "$W/cumsum_2p7b_$NAME" python3 benchmarks/run_config.py \
      mamba2_chunk_cumsum_tilelang --workload mamba2-2p7b-b2-s32k-dt-bias --config "$CONFIG" --iters 3 \
      > "$W/ncu_run_$NAME.log" 2>&1
    tail -3 "$W/ncu_run_$NAME.log"
    "$NCU" --import "$W/cumsum_2p7b_$NAME.ncu-rep" --page details > "$W/profile_$NAME.txt" 2>&1
    echo "== $NAME"
    grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Waves Per SM|Registers Per Thread|Grid Size|Eligible Warps" \
      "$W/profile_$NAME.txt" | head -12
  done
else
  echo "no profiles (ncu: ${NCU:-not found})" | tee "$W/profile.txt"
fi
if [[ ${RETUNE:-0} == 1 ]]; then  # TEMPLATES picks which sweeps run (default both); DB: a store to continue
  [[ -n ${DB_FROM:-} ]] && cp "$DB_FROM" "$W/chunk_cumsum.db"
  for T in ${TEMPLATES:-mamba2_chunk_cumsum mamba2_chunk_cumsum_tilelang}; do
    TRIALS=60; [[ $T == mamba2_chunk_cumsum_tilelang ]] && TRIALS=64
    bash benchmarks/h200/tune_chunk_cumsum.sh "$T" "$TRIALS" "$W"
  done
fi
tar -cJf "$OUT/followup.tar.xz" -C "$W" .
