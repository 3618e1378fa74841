#!/usr/bin/env bash
# Run as benchmarks/h200/chunk_cumsum_2026-12-04b/sweep2.sh $OUT/s2; moved into sweep2/ with its output.
# 2026-12-04 (twenty-fifth session), the call after sweep.sh: the same subspace on the fp32 row of 1p3b without
# bias (1.17x, the other fp32 row under 1.2x), then the unseen shapes measured again (two are answered from 2p7b,
# whose best changed in sweep.sh). GPU machine, PYTHONPATH=/tmp/site:$PWD TRITON_INTERPRET=0.
OUT=${1:?outdir}; mkdir -p "$OUT"; DB=sqlite:///$PWD/benchmarks/h200/chunk_cumsum.db
export TILELANG_CACHE_DIR=$PWD/.cache/tilelang TRITON_CACHE_DIR=$PWD/.cache/triton COLUMNS=200 PYTHONUNBUFFERED=1
timeout ${SWEEP_TIMEOUT:-150} python3 -m tuner.cli tune mamba2_chunk_cumsum_tilelang \
  -s B=8,S=2048,H=64,has_bias=false,dtype=float32 --exhaustive --only block_h=8,16 --only threads=128,256 --only min_blocks=0,6,8,12,16 --only fast_math=true --only layout=hq --only load_cache=default --only pad=4 --only persist=1 --only prefix=tree --only rows=1 --only scan=warp --only store=direct --only sweep=heads --only vec=1 \
  --samples 100 --finalists 3 --device cuda --db "$DB" > "$OUT/sweep.log" 2>&1; echo "rc=$?" >> "$OUT/sweep.log"
cp benchmarks/h200/chunk_cumsum.db "$OUT/"
TUNE_TIMEOUT=1 MEASURE_TIMEOUT=200 WORKERS_AUTO=0 bash benchmarks/h200/verify_session.sh unseen "$OUT/u"
