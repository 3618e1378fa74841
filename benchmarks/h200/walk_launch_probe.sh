#!/usr/bin/env bash
# The state walk's own launch settings (the first probe ran it with the chunk kernels': 2 or 4 warps, maxnreg
# 255/... ), and its widest column blocks (scan_block 1024/2048: 64/128 columns of P per program), on the
# shapes where the walk won. usage: bash benchmarks/h200/walk_launch_probe.sh OUT_DIR
set -u
out=${1:?OUT_DIR}
mkdir -p "$out"
shapes=${SHAPES:-"mimo-n128-p64-r4 mimo-n256-p64-r4 mimo-n64-p128-r4 mimo-n128-p128-r4 mimo-n128-p64-r8 mimo-n16-p64-r4"}
b2='"variant":"split2","chunk_rows":32,"block_n":16,"prec":"lowp3","prec_rot":"lowp3","num_warps":2,"num_stages":2,"scan_chunks":4,"state_pass":"walk"'
b4='"variant":"split2","chunk_rows":32,"block_n":16,"prec":"lowp3","prec_rot":"lowp3","num_warps":4,"num_stages":3,"scan_chunks":4,"state_pass":"walk"'
i=0
for wl in '' '{"num_warps":4,"num_stages":2}' '{"num_warps":8,"num_stages":2}'; do
  i=$((i+1))
  timeout "${PROBE_TIMEOUT:-200}" python benchmarks/h200/mimo_probe.py --workloads $shapes --samples "${SAMPLES:-10}" \
    --timeout 150 ${wl:+--walk-launch "$wl"} --json "$out/launch$i.json" --configs \
    "{$b2,\"scan_block\":1024}" "{$b4,\"scan_block\":1024}" "{$b4,\"scan_block\":2048}" > "$out/launch$i.log" 2>&1
  echo "launch $i ($wl) rc=$?"
done
python - "$out" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/launch*.json")):
    for r in sorted((r for r in json.load(open(f)) if "us" in r), key=lambda r: (r["workload"], r["us"]["total"])):
        c, u = json.loads(r["config"]), r["us"]
        walk = next((v for k, v in u.items() if k.startswith("state_walk")), 0.0)
        print(f"{f[-12:-5]:8s} {r['workload']:18s} w{c['num_warps']} sb{c['scan_block']:<5d} total {u['total']:8.1f} walk {walk:7.1f} {r['status'][:20]}")
PY
