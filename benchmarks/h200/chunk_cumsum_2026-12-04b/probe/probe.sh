#!/usr/bin/env bash
# Run as benchmarks/h200/chunk_cumsum_2026-12-04b/probe.sh $OUT/probe; moved into probe/ with its output.
# 2026-12-04 (twenty-fifth session): variants of the 2p7b best (warp scan, 128 threads) on 2p7b fp16/fp32 and 1p3b fp32 without bias,
# contract flush only; GPU machine, PYTHONPATH=/tmp/site:$PWD TRITON_INTERPRET=0. Output: probe.md and probe.json in $1.
OUT=${1:?outdir}; mkdir -p "$OUT"
python3 benchmarks/l2_flush_effect.py --samples 100 --flush zero --jobs 16 --json "$OUT/probe.json" \
  --shape B=2,S=32768,H=80,has_bias=true,dtype=float16 --shape B=2,S=32768,H=80,has_bias=true,dtype=float32 \
  --shape B=8,S=2048,H=64,has_bias=false,dtype=float32 \
  --config '{"block_h":8,"fast_math":true,"layout":"hq","load_cache":"default","min_blocks":0,"pad":4,"persist":1,"prefix":"tree","rows":1,"scan":"warp","store":"direct","sweep":"heads","threads":128,"vec":1}' \
  --config '{"block_h":8,"fast_math":true,"layout":"hq","load_cache":"default","min_blocks":12,"pad":4,"persist":1,"prefix":"tree","rows":1,"scan":"warp","store":"direct","sweep":"heads","threads":128,"vec":1}' \
  --config '{"block_h":8,"fast_math":true,"layout":"hq","load_cache":"default","min_blocks":16,"pad":4,"persist":1,"prefix":"tree","rows":1,"scan":"warp","store":"direct","sweep":"heads","threads":128,"vec":1}' \
  --config '{"block_h":16,"fast_math":true,"layout":"hq","load_cache":"default","min_blocks":0,"pad":4,"persist":1,"prefix":"tree","rows":1,"scan":"warp","store":"direct","sweep":"heads","threads":256,"vec":1}' \
  --config '{"block_h":16,"fast_math":true,"layout":"hq","load_cache":"default","min_blocks":6,"pad":4,"persist":1,"prefix":"tree","rows":1,"scan":"warp","store":"direct","sweep":"heads","threads":256,"vec":1}' \
  --config '{"block_h":8,"fast_math":true,"layout":"hq","load_cache":"default","min_blocks":0,"pad":4,"persist":2,"prefix":"tree","rows":1,"scan":"warp","store":"direct","sweep":"heads","threads":128,"vec":1}' \
  --config '{"block_h":8,"fast_math":true,"layout":"hq","load_cache":"default","min_blocks":0,"pad":4,"persist":1,"prefix":"tree","rows":1,"scan":"warp","store":"direct","sweep":"chunks","threads":128,"vec":1}' \
  --config '{"block_h":8,"fast_math":true,"layout":"hq","load_cache":"default","min_blocks":8,"pad":4,"persist":1,"prefix":"tree","rows":1,"scan":"warp","store":"direct","sweep":"heads","threads":256,"vec":1}' \
  --config '{"block_h":8,"fast_math":true,"layout":"hq","load_cache":"default","min_blocks":8,"pad":4,"persist":2,"prefix":"tree","rows":1,"scan":"warp","store":"direct","sweep":"heads","threads":256,"vec":1}' \
  --config '{"block_h":8,"fast_math":true,"layout":"hq","load_cache":"default","min_blocks":0,"pad":4,"persist":1,"prefix":"tree","rows":2,"scan":"warp","store":"direct","sweep":"heads","threads":256,"vec":1}' > "$OUT/probe.md"
cat "$OUT/probe.md"
