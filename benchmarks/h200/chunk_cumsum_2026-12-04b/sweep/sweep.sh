#!/usr/bin/env bash
# Run as benchmarks/h200/chunk_cumsum_2026-12-04b/sweep.sh $OUT/s; moved into sweep/ with its output.
# 2026-12-04 (twenty-fifth session): the register/occupancy subspace of the warp scan (block_h 8/16, threads
# 128/256, min_blocks 0/6/8/12/16, the rest as the 2p7b best) measured exhaustively in the committed store's
# version-6 studies of 2p7b fp16 and fp32 (each study's final round then re-ranks and publishes), then
# `tuner verify` of 2p7b fp16 in 3 fresh processes. GPU machine, PYTHONPATH=/tmp/site:$PWD TRITON_INTERPRET=0.
OUT=${1:?outdir}; mkdir -p "$OUT"; DB=sqlite:///$PWD/benchmarks/h200/chunk_cumsum.db
export TILELANG_CACHE_DIR=$PWD/.cache/tilelang TRITON_CACHE_DIR=$PWD/.cache/triton COLUMNS=200 PYTHONUNBUFFERED=1
timeout ${SWEEP_TIMEOUT:-330} python3 -m tuner.cli tune mamba2_chunk_cumsum_tilelang -w mamba2-2p7b-b2-s32k-dt-bias \
  -s B=2,S=32768,H=80,has_bias=true,dtype=float32 --exhaustive --only block_h=8,16 --only threads=128,256 --only min_blocks=0,6,8,12,16 --only fast_math=true --only layout=hq --only load_cache=default --only pad=4 --only persist=1 --only prefix=tree --only rows=1 --only scan=warp --only store=direct --only sweep=heads --only vec=1 \
  --samples 100 --finalists 3 --device cuda --db "$DB" > "$OUT/sweep.log" 2>&1; echo "rc=$?" >> "$OUT/sweep.log"
cp benchmarks/h200/chunk_cumsum.db "$OUT/"
timeout ${VERIFY_TIMEOUT:-150} python3 -m tuner.cli verify mamba2_chunk_cumsum_tilelang -w mamba2-2p7b-b2-s32k-dt-bias \
  --processes 3 --samples 100 --device cuda --db "$DB" --json > "$OUT/verify.log" 2>&1; echo "rc=$?" >> "$OUT/verify.log"
cp benchmarks/h200/chunk_cumsum.db "$OUT/"
