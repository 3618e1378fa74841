#!/usr/bin/env bash
# MIMO N64 P128's chunk_values_kernel in its two process states (mimo_2026-12-05b/README.md): launched first
# (fast) and after one cuBLAS matmul on the main thread (slow, the measuring process's state). Nsight Compute
# (`--set full`, one warm launch each) of the kernel in each, then every metric that differs by more than
# MIN_PCT (3) percent between the two, largest first. GPU machine, one bundle on PYTHONPATH:
#   bash benchmarks/h200/mimo_states_ncu.sh OUTDIR
set -uo pipefail
OUT=${1:?outdir}; mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export TRITON_CACHE_DIR=$PWD/.cache/triton PYTHONUNBUFFERED=1
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1)
[[ -n $ncu ]] || { echo "error: ncu not found" >&2; exit 2; }
C=${CONFIG:-'{"block_n":16,"chunk_rows":32,"group_chunks":4,"num_stages":3,"num_warps":4,"prec":"lowp3","prec_rot":"lowp3","qk_warps":"half","scan_block":2048,"scan_chunks":4,"state_pass":"walk","variant":"split2"}'}
for state in first matmul; do
  extra=(); [[ $state == matmul ]] && extra=(--matmul-first)
  echo "== $state ($(date -u +%H:%M:%S))"
  timeout "${PROFILE_TIMEOUT:-150}" "$ncu" --clock-control none --set full --kernel-name regex:chunk_values \
    --launch-skip 1 --launch-count 1 -o "$OUT/$state" \
    python3 benchmarks/run_config.py mamba3_mimo_bwd --workload "${WORKLOAD:-mimo-n64-p128-r4}" --config "$C" \
    --iters 2 "${extra[@]}" > "$OUT/ncu_run_$state.log" 2>&1
  echo "rc=$?" >> "$OUT/ncu_run_$state.log"; tail -3 "$OUT/ncu_run_$state.log"
  "$ncu" --import "$OUT/$state.ncu-rep" --page raw --csv > "$OUT/raw_$state.csv" 2>&1
  "$ncu" --import "$OUT/$state.ncu-rep" --page details > "$OUT/details_$state.txt" 2>&1
  rm -f "$OUT/$state.ncu-rep"
done
python3 - "$OUT/raw_first.csv" "$OUT/raw_matmul.csv" "${MIN_PCT:-3}" <<'PY' | tee "$OUT/differences.md"
import csv, sys
def row(path):
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    return dict(zip(rows[head], rows[head + 2])), dict(zip(rows[head], rows[head + 1]))
(a, units), (b, _) = row(sys.argv[1]), row(sys.argv[2])
def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None
out = []
for k in a:
    x, y = num(a[k]), num(b.get(k, ""))
    if x is None or y is None:
        if a[k] != b.get(k) and k not in ("ID", "Process ID", "Host Name", "Context", "Stream"):
            out.append((float("inf"), k, a[k], b.get(k), ""))
        continue
    if x == y == 0:
        continue
    pct = 100 * (y - x) / max(abs(x), 1e-30)
    if abs(pct) > float(sys.argv[3]):
        out.append((abs(pct), k, a[k], b[k], f"{pct:+.1f}%"))
print("| metric | unit | launched first | after a matmul | change |\n|---|---|---|---|---|")
for _, k, x, y, p in sorted(out, key=lambda t: -t[0])[:80]:
    print(f"| {k} | {units.get(k, '')} | {x} | {y} | {p} |")
PY
