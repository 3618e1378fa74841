#!/usr/bin/env bash
# What issue 4 still needs from the H200, in one call: the parallel-compile speed-up of the TileLang template
# on the host's 16 cores, and an Nsight Compute profile of its best 2p7b kernel (the row short of 80% of the
# copy bandwidth). Bundle: ../shared/tools/gpu-bundle .gpu (tilelang 0.1.15), then
# PYTHONPATH=/tmp/site:$PWD TRITON_INTERPRET=0.
#
# usage: benchmarks/h200/followup_chunk_cumsum.sh OUTDIR
set -euo pipefail
OUT=${1:?outdir}; mkdir -p "$OUT"
# The tuned best config for mamba2-2p7b-b2-s32k-dt-bias (benchmarks/h200/chunk_cumsum.md, 2026-11-29).
BEST='{"block_h":8,"fast_math":true,"layout":"qh","pad":1,"prefix":"tree","rows":1,"scan":"twolevel","store":"staged","sweep":"heads","threads":256,"vec":1}'
python3 benchmarks/compile_throughput.py mamba2_chunk_cumsum_tilelang --workload mamba2-2p7b-b2-s32k-dt-bias \
  --configs 32 --workers 16 --json "$OUT/compile_throughput.json" 2>&1 | grep -v TileLang | tee "$OUT/compile_throughput.log"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1 || true)
if [[ -z $NCU ]]; then echo "ncu not found on this machine" | tee "$OUT/profile.txt"; exit 0; fi
"$NCU" --target-processes all --kernel-name regex:chunk_cumsum --launch-skip 2 --launch-count 1 --set full \
  -o "$OUT/cumsum_2p7b" python3 benchmarks/run_config.py mamba2_chunk_cumsum_tilelang \
  --workload mamba2-2p7b-b2-s32k-dt-bias --config "$BEST" --iters 3 > "$OUT/ncu_run.log" 2>&1 || true
"$NCU" --import "$OUT/cumsum_2p7b.ncu-rep" --page details > "$OUT/profile.txt" 2>&1 || true
grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Waves Per SM|Registers Per Thread|Block Size|Grid Size|L2 Hit|Stall" "$OUT/profile.txt" | head -40
