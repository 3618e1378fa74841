#!/usr/bin/env bash
# One device call: benchmarks/h200/cumsum_load_probe.py on the served bests of the rows issue 16 still misses
# (the fp32 rows of 2p7b and of 1p3b without bias), three rows it meets, and 130m-b1-s2k; each with load
# fused / regs / copy (and min_blocks 12 where the config runs 128 threads). Written 2026-12-05 (thirty-second
# session). Bundles (carry .gpu and .gpux):
#   rm -rf /tmp/site && mkdir -p /tmp/site && tar -xJf .gpu/site.tar.xz -C /tmp/site &&
#   tar -xJf .gpux/x.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD TRITON_INTERPRET=0 &&
#   bash benchmarks/h200/cumsum_load_probe.sh $OUT
set -uo pipefail
OUT=${1:?outdir}
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" .cache/tilelang .cache/triton
export COLUMNS=200 PYTHONUNBUFFERED=1 TL_LOG_LEVEL=${TL_LOG_LEVEL:-WARNING}
export TILELANG_CACHE_DIR=$PWD/.cache/tilelang TRITON_CACHE_DIR=$PWD/.cache/triton
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt"
W='"scan":"warp","store":"direct","prefix":"tree","layout":"hq","pad":4'
timeout "${PROBE_TIMEOUT:-330}" python3 benchmarks/h200/cumsum_load_probe.py --samples "${SAMPLES:-100}" \
  --rounds "${ROUNDS:-2}" --min-blocks 12 \
  --case "B=2,S=32768,H=80,has_bias=true,dtype=float32|{$W,\"block_h\":8,\"threads\":128,\"min_blocks\":16}" \
  --case "B=8,S=2048,H=64,has_bias=false,dtype=float32|{$W,\"block_h\":8,\"threads\":256,\"min_blocks\":8}" \
  --case "B=2,S=32768,H=80,has_bias=true,dtype=float16|{$W,\"block_h\":8,\"threads\":128,\"min_blocks\":16}" \
  --case "B=8,S=2048,H=64,has_bias=false,dtype=bfloat16|{$W,\"block_h\":8,\"threads\":256,\"min_blocks\":0}" \
  --case "B=1,S=4096,H=48,has_bias=false,dtype=float16|{$W,\"block_h\":8,\"threads\":256,\"min_blocks\":0}" \
  --case "B=1,S=2048,H=24,has_bias=true,dtype=float16|{$W,\"block_h\":4,\"threads\":128,\"min_blocks\":0}" \
  --json "$OUT/probe.json" --md "$OUT/probe.md" > "$OUT/probe.log" 2>&1
echo "rc=$?" >> "$OUT/probe.log"
