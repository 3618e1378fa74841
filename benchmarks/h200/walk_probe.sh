#!/usr/bin/env bash
# Template version 3 on the H200, before any sweep: the state walk (state_pass walk, columns of P per program
# = scan_block / 16) against pass A + scan on the configs that won every shape under version 2, and the
# epilogue in segments (every row). One probe run: checks in parallel processes, then per-kernel CUPTI times.
# usage: bash benchmarks/h200/walk_probe.sh OUT_DIR  (PYTHONPATH with the GPU bundle set)
set -u
out=${1:?OUT_DIR}
mkdir -p "$out"
shapes=${SHAPES:-"mimo-n16-p64-r4 mimo-n32-p64-r4 mimo-n64-p64-r4 mimo-n128-p64-r4 mimo-n256-p64-r4 mimo-n64-p128-r4 mimo-n128-p32-r4 mimo-n128-p128-r4 mimo-n128-p64-r8 mimo-n128-p64-r2 mimo-n128-p64-r1"}
b2='"variant":"split2","chunk_rows":32,"block_n":16,"prec":"lowp3","prec_rot":"lowp3","num_warps":2,"num_stages":2,"scan_chunks":4'
b4='"variant":"split2","chunk_rows":32,"block_n":16,"prec":"lowp3","prec_rot":"lowp3","num_warps":4,"num_stages":3,"scan_chunks":4'
timeout "${PROBE_TIMEOUT:-500}" python benchmarks/h200/mimo_probe.py --workloads $shapes --samples "${SAMPLES:-10}" \
  --timeout "${CHECK_TIMEOUT:-300}" --json "$out/walk.json" --configs \
  "{$b2,\"scan_block\":512,\"state_pass\":\"scan\"}" \
  "{$b2,\"scan_block\":256,\"state_pass\":\"walk\"}" \
  "{$b2,\"scan_block\":512,\"state_pass\":\"walk\"}" \
  "{$b2,\"scan_block\":1024,\"state_pass\":\"walk\"}" \
  "{$b4,\"scan_block\":512,\"state_pass\":\"scan\"}" \
  "{$b4,\"scan_block\":256,\"state_pass\":\"walk\"}" \
  "{$b4,\"scan_block\":512,\"state_pass\":\"walk\"}" \
  > "$out/walk.log" 2>&1
echo "probe rc=$?"
python - "$out/walk.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1])) if "us" in r]
print(f"{'workload':18s} {'warps':>5s} {'pass':>5s} {'sb':>5s} {'total':>8s} {'state':>7s} {'epi':>6s} {'values':>7s} {'qk':>7s} maxerr")
for r in sorted(rows, key=lambda r: (r["workload"], json.loads(r["config"])["num_warps"], r["us"]["total"])):
    c, u = json.loads(r["config"]), r["us"]
    state = sum(v for k, v in u.items() if k.startswith(("group_local", "state_scan", "state_walk")))
    pick = lambda p: next((v for k, v in u.items() if k.startswith(p)), 0.0)
    print(f"{r['workload']:18s} {c['num_warps']:5d} {c['state_pass']:>5s} {c['scan_block']:5d} {u['total']:8.1f} "
          f"{state:7.1f} {pick('epilogue'):6.1f} {pick('chunk_values'):7.1f} {pick('chunk_qk'):7.1f} "
          f"{max(r['errors'].values()):.1e} {r['status'][:40]}")
PY
