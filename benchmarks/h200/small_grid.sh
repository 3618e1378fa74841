#!/usr/bin/env bash
# Issue 16's latency-bound chunk-cumsum shapes (B = 1, H = 24, 1-2k tokens, about 2 us): one device call.
#
#   probe    OUTDIR  the served best of 130m-b1-s2k and the small-grid seeds of the search space (2 or 4 heads
#                    per CTA, 64 threads), interleaved in one process, on 130m-b1-s2k and 130m-b1-s1k under the
#                    timing contract (benchmarks/l2_flush_effect.py --flush zero: L2 flushed by zero_() before
#                    every sample, CUPTI, median of 100), each checked against the reference
#   sweep    OUTDIR  instead of tune's trials, every config of the small-grid subspace of the warp scan (2, 4 or
#                    8 heads per CTA, 64-256 threads, hq or qh staging, min_blocks 0 or 16), then tune's verify
#   tune     OUTDIR  TRIALS (24) more trials of 130m-b1-s2k in the committed store (the seeds it has not
#                    measured come first), its final round, then `tuner verify` of the served best in
#                    PROCESSES (4) fresh processes with every comparator line
#   measure  OUTDIR  benchmarks/unseen_shapes.py measure on the committed store (every shape of the set as the
#                    server answers it, against mamba_ssm as users call it)
# Written 2026-12-05 (thirtieth session); first run 2026-12-05 16:15-16:22 UTC (`probe tune`, then `sweep`) on
# an H100, not an H200 (small_grid_2026-12-05/README.md): the H200's figures need the same call there.
# Phases run in the order given (e.g. `probe tune`), each within its time limit; logs, JSON and the store go to
# OUTDIR. Bundles (carry .gpu and .gpux):
#   rm -rf /tmp/site && mkdir -p /tmp/site && tar -xJf .gpu/site.tar.xz -C /tmp/site &&
#   tar -xJf .gpux/x.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD TRITON_INTERPRET=0 &&
#   bash benchmarks/h200/small_grid.sh $OUT probe tune
set -uo pipefail
OUT=${1:?outdir}; shift
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" || { echo "error: cannot create $OUT" >&2; exit 2; }
export COLUMNS=200 PYTHONUNBUFFERED=1 TL_LOG_LEVEL=${TL_LOG_LEVEL:-WARNING}
mkdir -p .cache/tilelang .cache/triton
export TILELANG_CACHE_DIR=$PWD/.cache/tilelang TRITON_CACHE_DIR=$PWD/.cache/triton
DB=sqlite:///benchmarks/h200/chunk_cumsum.db
S2K=B=1,S=2048,H=24,has_bias=true,dtype=float16
S1K=B=1,S=1024,H=24,has_bias=true,dtype=float16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt"
run() {  # name timeout command...
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date -u +%H:%M:%S))"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?" >> "$OUT/$name.log"
}
for phase in "$@"; do
  case $phase in
    probe)
      # overrides of the template's default: the served best (warp scan, 8 heads, 256 threads), the 4 heads /
      # 128 threads seed, and the four small-grid seeds
      WARP='"scan":"warp","prefix":"tree","store":"direct"'
      run probe "${PROBE_TIMEOUT:-150}" python3 benchmarks/l2_flush_effect.py --samples 100 --flush zero --jobs 16 \
        --shape "$S2K" --shape "$S1K" \
        --config "{$WARP,\"layout\":\"hq\",\"pad\":4}" \
        --config "{$WARP,\"layout\":\"hq\",\"pad\":4,\"block_h\":4,\"threads\":128}" \
        --config "{$WARP,\"layout\":\"hq\",\"pad\":4,\"block_h\":2,\"threads\":64}" \
        --config "{$WARP,\"layout\":\"hq\",\"pad\":4,\"block_h\":4,\"threads\":64}" \
        --config "{$WARP,\"block_h\":2,\"threads\":64}" \
        --config '{"store":"direct","layout":"hq","pad":4,"block_h":1,"threads":64}' \
        --json "$OUT/probe.json"
      tail -30 "$OUT/probe.log" ;;
    tune|sweep)
      if [ "$phase" = tune ]; then
        run tune "${TUNE_TIMEOUT:-200}" python3 -m tuner.cli tune mamba2_chunk_cumsum_tilelang -s "$S2K" \
          --trials "${TRIALS:-24}" --samples 100 --finalists 3 --device cuda --seed 7 --db "$DB"
      else  # the small-grid subspace of the warp scan, every config of it
        run tune "${TUNE_TIMEOUT:-200}" python3 -m tuner.cli tune mamba2_chunk_cumsum_tilelang -s "$S2K" \
          --exhaustive --only scan=warp --only store=direct --only block_h=2,4,8 --only threads=64,128,256 \
          --only layout=hq,qh --only pad=4 --only min_blocks=0,16 --only fast_math=true --only load_cache=default \
          --only persist=1 --only prefix=tree --only rows=1 --only sweep=heads --only vec=1 \
          --samples 100 --finalists 3 --device cuda --db "$DB"
      fi
      grep -E "measured trials|best config|rc=|rror" "$OUT/tune.log" | cut -c1-220 | tail -8
      run verify "${VERIFY_TIMEOUT:-150}" python3 -m tuner.cli verify mamba2_chunk_cumsum_tilelang -s "$S2K" \
        --processes "${PROCESSES:-4}" --samples 100 --device cuda --db "$DB" --json
      python3 - "$OUT/verify.log" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
try:
    doc = json.loads(text[text.find("{"):text.rfind("}") + 1])
except ValueError:
    print(text[-1500:]); raise SystemExit
print("config", json.dumps(doc.get("config")), "stored", doc.get("stored_us"), "drift", doc.get("drift"))
for i, proc in enumerate(doc.get("processes", []), 1):
    ok = {c["label"]: c["median_us"] for c in proc["candidates"] if c["status"] == "OK"}
    rivals = {k: v for k, v in ok.items() if k.startswith("comparator:mamba_ssm") and "tileops" not in k}
    best, (name, rival) = ok.get("best"), min(rivals.items(), key=lambda kv: kv[1]) if rivals else ("-", None)
    ratio = f"{rival / best:.3f}x" if best and rival else "-"
    print(f"process {i}: best {best} us, strongest mamba_ssm line {name} {rival} us, {ratio}")
PY
      cp benchmarks/h200/chunk_cumsum.db "$OUT/" ;;
    measure)
      run measure_unseen "${MEASURE_TIMEOUT:-280}" python3 benchmarks/unseen_shapes.py measure --db "$DB" \
        --samples 100 --json "$OUT/unseen_shapes.json" --md "$OUT/unseen_shapes.md"
      tail -6 "$OUT/measure_unseen.log" ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
