#!/usr/bin/env bash
# Does Triton's Hopper wgmma path run the MIMO backward's kernels now, and is it faster? (issue 16's "why did
# wgmma fault?"). Two probe runs on one GPU host: 64/128-row split2, split and fused configs with wgmma
# allowed, then the shapes' published configs (32-row tiles: no wgmma, M < 64) and one 64-row control with
# mma.sync only. usage: bash benchmarks/h200/wgmma_probe.sh OUT_DIR  (PYTHONPATH with the GPU bundle set)
set -u
out=${1:?OUT_DIR}
mkdir -p "$out"
shapes=${SHAPES:-"mimo-n128-p64-r4 mimo-n64-p128-r4 mimo-n128-p128-r4"}
samples=${SAMPLES:-10}
base='"variant":"split2","prec":"lowp3","prec_rot":"lowp3","block_n":16,"scan_block":512,"scan_chunks":4'
timeout "${WG_TIMEOUT:-330}" python benchmarks/h200/mimo_probe.py --mma wgmma --workloads $shapes --samples "$samples" \
  --timeout "${CHECK_TIMEOUT:-240}" --json "$out/wgmma.json" --configs \
  "{$base,\"chunk_rows\":64,\"num_warps\":4,\"num_stages\":2}" \
  "{$base,\"chunk_rows\":64,\"num_warps\":8,\"num_stages\":2}" \
  "{$base,\"chunk_rows\":128,\"num_warps\":8,\"num_stages\":2}" \
  "{$base,\"chunk_rows\":64,\"num_warps\":4,\"num_stages\":2,\"variant\":\"split\"}" \
  "{$base,\"chunk_rows\":64,\"num_warps\":4,\"num_stages\":2,\"variant\":\"fused\",\"scan_block\":512,\"scan_chunks\":8}" \
  > "$out/wgmma.log" 2>&1
echo "wgmma probe rc=$?"
timeout "${SYNC_TIMEOUT:-200}" python benchmarks/h200/mimo_probe.py --mma sync --workloads $shapes --samples "$samples" \
  --timeout "${CHECK_TIMEOUT:-240}" --json "$out/sync.json" --configs \
  "{$base,\"chunk_rows\":32,\"num_warps\":2,\"num_stages\":2}" \
  "{$base,\"chunk_rows\":32,\"num_warps\":4,\"num_stages\":3}" \
  "{$base,\"chunk_rows\":64,\"num_warps\":4,\"num_stages\":2}" \
  > "$out/sync.log" 2>&1
echo "sync probe rc=$?"
for f in wgmma sync; do echo "== $f"; sed -n '/^workload /,$p' "$out/$f.log"; done
