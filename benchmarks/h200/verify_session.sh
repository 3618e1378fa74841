#!/usr/bin/env bash
# Issue 15's H200 runs (and issue 17's exhaustive records), in phases of at most ~9 minutes, one device call
# each, on one warm machine. Everything a phase writes goes into OUTDIR/<phase>.tar.xz (the device tool
# returns at most 8 files); stores it updates are also copied to OUTDIR/ on their own.
#
#   cumsum   OUTDIR  fresh final rounds of both chunk-cumsum templates on the five workloads (a few trials more
#                    each, continuing the committed store benchmarks/h200/chunk_cumsum.db: every comparator
#                    line as users call mamba_ssm, its contract variants and the elementwise ceiling), and the
#                    TileLang template on mamba_ssm's contract (fp32 dt_out) for the five shapes
#   verify   OUTDIR  `tuner verify` of the served chunk-cumsum bests (TileLang) on the five workloads
#                    (VERIFY_WORKLOADS: those named), PROCESSES (5) fresh processes each, within VERIFY_TIMEOUT
#                    (300 s; about 75 s per workload at 3 processes with every comparator line, 2026-12-04), then
#                    exhaustive subspaces (issue 17) as far as EXH_TIMEOUT allows (EXHAUSTIVE=0: none)
#   mimo     OUTDIR  `tuner verify` of the MIMO backward bests (bundle --tilelang mamba) on WORKLOADS
#                    (default: all 11; VERIFY_WORKLOADS narrows the verify), PROCESSES (5) fresh processes each (COMPARATORS=0: the
#                    bests alone, a fresh machine without the comparators' minutes of TileLang builds; else the comparator in the first COMPARATOR_PROCESSES,
#                    default all), after warming the compile caches with each shape's served best and the
#                    comparator (WARM=0 skips that), and timing a fresh process's comparator build (cache probe).
#                    `tuner verify` re-measures bests of the current template version only: a shape served
#                    from a carried version (MIMO version 4 carries 3) has none until a final round publishes.
#                    A disproved best's stand-in is verified in turn (STAND_INS, default 3; each as long as the
#                    first: 2026-12-03, eighteenth session, two such stand-ins took a device call each).
#                    The verify's time limit: VERIFY_TIMEOUT seconds when given (keep it inside the device
#                    call, or the store's copy to OUTDIR after it is lost), else what is left of BUDGET when
#                    that is at least 120 s (else it is skipped, and says so)
#   mimo-sweep OUTDIR (bundle --tilelang mamba) issue 16's sweeps in the committed MIMO store: after warming the
#                    compile caches (TileLang, the default and seeds of WARM_WORKLOADS, default the sweep's;
#                    COMPARATOR_ONLY=1: TileLang alone; WARM=0 skips that on a warm machine and, on a fresh one with an empty
#                    TileLang cache, builds the sweep's TileLang alone first unless COLD_OK=1; WARM=bg builds the
#                    TileLang comparators of WARM_WORKLOADS in the background during the sweeps), up to TRIALS (40)
#                    more trials (SWEEP_ONLY="--only NAME=V1,V2 …": that subspace, exhaustively;
#                    SWEEP_ONLY_<workload, - as _>: that shape's own) and a final
#                    round with the TileLang line on each of SWEEP_WORKLOADS (default
#                    N128 P64 R2), each within TUNE_TIMEOUT seconds and the BUDGET left (`tuner tune
#                    --time-limit` stops new trials RESERVE_S before that; FINAL_ONLY=1: no new trial, the final
#                    round alone; CANDIDATE_TIMEOUT, default 240 s, bounds a candidate and twice it a pool build);
#                    then issue 17's MIMO exhaustive subspace
#                    (variant × chunk_rows × num_warps × num_stages × prec) on two shapes into
#                    exhaustive_mimo_bwd.db for EXH_TIMEOUT seconds (1: skip)
#   mimo-profile OUTDIR (bundle --tilelang mamba) issue 16's profiles: Nsight Compute (`--set full`, one launch
#                    of each kernel after a warm-up call) of the served best of each of PROFILE_WORKLOADS (default
#                    the two shapes nearest 1x: N128 P64 R8 and R1), kernel by kernel; a table of duration, DRAM
#                    and L2 throughput, occupancy, registers, eligible warps and the top stall reason per kernel
#   cumsum-profile OUTDIR issue 16's chunk-cumsum profiles: Nsight Compute (`--set full`) of the served best
#                    (TileLang), mamba_ssm's wrapper as users call it and the elementwise kernel of the same bytes
#                    (PROFILE_LINES) on each of PROFILE_SHAPES (default: 2p7b in fp16 and in fp32), same tables
#   unseen   OUTDIR  issue 16's shapes nobody tuned (benchmarks/unseen_shapes.py): tune its "tune" part in the
#                    committed chunk-cumsum store (TUNE=0: not), then measure every shape's served config against mamba_ssm
#                    as users call it; and issue 18's single-GPU run of `tuner serve --workers auto`
#                    (WORKERS_AUTO=0 skips that)
# Bundles: ../shared/tools/gpu-bundle .gpu (cumsum, verify) or --tilelang mamba .gpum (mimo*), each unpacked
# alone into an emptied /tmp/site, plus benchmarks/h200/extras_bundle.sh .gpux over it; then
# PYTHONPATH=/tmp/site:$PWD TRITON_INTERPRET=0. E.g. (carry .gpum and .gpux):
#   rm -rf /tmp/site && mkdir -p /tmp/site && tar -xJf .gpum/site.tar.xz -C /tmp/site &&
#   tar -xJf .gpux/x.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD TRITON_INTERPRET=0 &&
#   bash benchmarks/h200/verify_session.sh mimo $OUT
# What travels to the GPU machine (tracked files plus the carried bundles) must stay under 64 MiB. Count it in
# bytes (2026-12-04: 63.1 MiB went, tree and .gpu and .gpux with the MIMO store aside):
#   { git ls-files -z; printf '%s\0' .gpum/site.tar.xz .gpux/x.tar.xz; } | du -cb --files0-from=- | tail -1
# (.gpu/site.tar.xz instead of .gpum's for the cumsum, verify and unseen phases)
# The tree is ~27 MiB, 17 MiB of it the two stores, and .gpu (~43 MiB) or .gpum with .gpux adds the rest: a
# call carries the store it works on and leaves the other out of the working tree for the call (mimo*: move
# benchmarks/h200/chunk_cumsum.db aside; cumsum, verify, unseen: move mamba3_mimo_bwd.db aside), and it goes
# back before a commit.
# Commit raw profiler reports (.ncu-rep) nowhere in the tree: their details pages and metrics are enough.
set -uo pipefail
PHASE=${1:?phase}; OUT=${2:?outdir}
cd "$(dirname "$0")/../.."
W=$(mktemp -d); H=benchmarks/h200; START=$(date +%s)
# A missing OUT made every copy of the store into it fail and the store's new studies were lost with the
# machine (2026-12-02, thirteenth session: `… mimo-sweep $OUT/a`).
mkdir -p "$OUT" || { echo "error: cannot create $OUT" >&2; exit 2; }
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - START) - 25 )); }  # seconds left of the call's BUDGET
export COLUMNS=200 PYTHONUNBUFFERED=1 TL_LOG_LEVEL=${TL_LOG_LEVEL:-WARNING}
# Compile caches in the (git-ignored) checkout: the device tool keeps ignored paths between calls on a warm
# machine, which it does not promise for $HOME.
mkdir -p .cache/tilelang .cache/triton
export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-$PWD/.cache/tilelang} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.cache/triton}
TUNER="python3 -m tuner.cli"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$W/gpu.txt"
date -u +"%Y-%m-%dT%H:%M:%SZ" | tee -a "$W/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$W/gpu.txt"
CUMSUM_DB="sqlite:///$PWD/$H/chunk_cumsum.db"
# The MIMO store of the mimo* phases lives in the (git-ignored) .cache/store/ of a warm machine, copied there
# from the committed store by the first call: each call re-copies the working tree's tracked files, which put
# back the committed store and dropped an earlier call's studies unless the operator had copied the returned
# store into the tree in the 30 s before the machine went idle. A fresh machine starts again from the
# committed store (copy the returned one in first). Every phase copies the store to OUTDIR.
MIMO_STORE=$PWD/.cache/store/mamba3_mimo_bwd.db
if [[ $PHASE == mimo* ]]; then
  mkdir -p .cache/store
  # A machine that went idle between calls is a fresh one: say so, since its store is then the working tree's
  # (2026-12-03, sixteenth session: a verify call started from the committed store, not the previous call's).
  ORIGIN="kept on this warm machine"
  [[ -f $MIMO_STORE ]] || { cp "$H/mamba3_mimo_bwd.db" "$MIMO_STORE"; ORIGIN="FRESH MACHINE: copied from the working tree's $H/mamba3_mimo_bwd.db"; }
  echo "MIMO store: $MIMO_STORE ($(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select count(*) from trials').fetchone()[0])" "$MIMO_STORE" 2>/dev/null || echo '?') trials; $ORIGIN)" | tee -a "$W/gpu.txt"
fi
# mamba_ssm's MIMO comparator needs tilelang 0.1.8 (bundle --tilelang mamba). Unpack each bundle into an empty
# folder: one unpacked over the other leaves both versions' package metadata, and the comparator then reports
# itself unavailable (seen on 2026-12-01: a final round without its TileLang line).
if [[ $PHASE == mimo || $PHASE == mimo-sweep ]]; then
  TL=$(python3 -c "import importlib.metadata as m; print(','.join(sorted(d.version for d in m.distributions() if (d.metadata['Name'] or '').lower() == 'tilelang')))")
  [[ $TL == 0.1.8 ]] || { echo "error: phase $PHASE needs exactly tilelang 0.1.8 installed, found: ${TL:-none}" >&2; exit 2; }
fi
# The five workloads on mamba_ssm's contract: dt_out in fp32, as its wrapper returns it.
FP32=(-s B=1,S=4096,H=48,has_bias=false,dtype=float32 -s B=8,S=2048,H=64,has_bias=false,dtype=float32
      -s B=1,S=4096,H=48,has_bias=true,dtype=float32 -s B=8,S=2048,H=64,has_bias=true,dtype=float32
      -s B=2,S=32768,H=80,has_bias=true,dtype=float32)
step() {  # name timeout command...: run, log to $W/name.log, print the log's summary lines
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date -u +%H:%M:%S))"
  timeout "$limit" "$@" > "$W/$name.log" 2>&1; echo "rc=$?" >> "$W/$name.log"
  grep -E "measured trials|best config for|drift|valid configs|cache probe|rc=|error|Error" "$W/$name.log" | cut -c1-220 | tail -14
}
# profile REPORT STEM run_config.py-args...: Nsight Compute (`--set full`) of one warm call (run_config.py calls
# twice: the first compiles and is skipped, the second is profiled), kernel by kernel, into $W/REPORT.ncu-rep;
# its details page (profile_STEM.txt), a table of duration, DRAM and L2 throughput, occupancy, registers,
# eligible warps, tensor pipe and grid (profile_STEM.csv), the run's log (ncu_run_STEM.log). A run that left no
# report (no served config for the shape: run_config.py says so in the log) is skipped with a line.
profile() {
  local report=$1 stem=$2; shift 2
  local ncu; ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1)
  [[ -n $ncu ]] || { echo "error: ncu not found" >&2; exit 2; }
  echo "== profile $stem: $* ($(date -u +%H:%M:%S))"
  timeout "${PROFILE_TIMEOUT:-240}" "$ncu" --clock-control none --target-processes all --set full \
    --kernel-name regex:. --replay-mode kernel --nvtx --nvtx-include "profiled/" -o "$W/$report" \
    python3 benchmarks/run_config.py "$@" --iters 2 --nvtx-last profiled > "$W/ncu_run_$stem.log" 2>&1
  echo "rc=$?" >> "$W/ncu_run_$stem.log"; tail -4 "$W/ncu_run_$stem.log"
  [[ -f $W/$report.ncu-rep ]] || { echo "no profile of $stem (ncu_run_$stem.log says why)"; return 0; }
  "$ncu" --import "$W/$report.ncu-rep" --page raw --csv --metrics \
        gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,smsp__warps_eligible.avg.per_cycle_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,launch__grid_size \
    > "$W/profile_$stem.csv" 2>&1
  "$ncu" --import "$W/$report.ncu-rep" --page details > "$W/profile_$stem.txt" 2>&1
  python3 "$H/ncu_summary.py" "$W/profile_$stem.txt" --min-us "${PROFILE_MIN_US:-50}"
  python3 - "$W/profile_$stem.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if head is None:
    print("".join(open(sys.argv[1]).read().splitlines(True)[-5:])); sys.exit()
cols = rows[head]; units = rows[head + 1]
want = ["Kernel Name", "gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "lts__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active",
        "launch__registers_per_thread", "smsp__warps_eligible.avg.per_cycle_active",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "launch__grid_size"]
names = dict(zip(want, ["kernel", "time", "dram%", "l2%", "occupancy%", "regs", "eligible/cycle", "tensor%", "grid"]))
idx = [cols.index(c) for c in want if c in cols]  # a metric this ncu does not report is left out, header too
print(" | ".join(names[c] for c in want if c in cols))
for r in rows[head + 2:]:
    print(" | ".join(r[i][:40] for i in idx))
PY
}
case $PHASE in
  cumsum)
    step tune_tilelang "${TUNE_TIMEOUT:-200}" $TUNER tune mamba2_chunk_cumsum_tilelang --all-workloads --trials "${TRIALS:-6}" \
      --samples 100 --finalists 3 --device cuda --seed 5 --db "$CUMSUM_DB"
    step tune_tilelang_fp32 200 $TUNER tune mamba2_chunk_cumsum_tilelang "${FP32[@]}" --trials "${FP32_TRIALS:-16}" \
      --samples 100 --finalists 3 --device cuda --seed 5 --db "$CUMSUM_DB"
    [[ ${TRITON_TRIALS:-2} == 0 ]] || step tune_triton 120 $TUNER tune mamba2_chunk_cumsum --all-workloads \
      --trials "${TRITON_TRIALS:-2}" --samples 100 --finalists 2 --device cuda --seed 5 --db "$CUMSUM_DB"
    cp "$H/chunk_cumsum.db" "$OUT/"
    ;;
  verify)
    SELECT=(--all-workloads)
    if [[ -n ${VERIFY_WORKLOADS:-} ]]; then SELECT=(); for w in $VERIFY_WORKLOADS; do SELECT+=(-w "$w"); done; fi
    step verify_cumsum "${VERIFY_TIMEOUT:-300}" $TUNER verify mamba2_chunk_cumsum_tilelang "${SELECT[@]}" \
      --processes "${PROCESSES:-5}" --samples 100 --device cuda --db "$CUMSUM_DB" --json
    cp "$H/chunk_cumsum.db" "$OUT/"
    if [[ ${EXHAUSTIVE:-1} != 0 ]]; then
    # Issue 17: exhaustive subspaces (resumable; a sweep cut short is a uniform sample of its subspace).
    EXH_DB="sqlite:///$PWD/$H/exhaustive_chunk_cumsum.db"
    TL_ONLY=(--only scan=twolevel --only prefix=tree --only store=staged --only pad=1 --only vec=1 --only layout=qh
             --only fast_math=true --only persist=1 --only min_blocks=0 --only load_cache=default
             --only threads=128,256)
    TR_ONLY=(--only layout=rows --only sweep=chunks --only persistent=0 --only hints=false --only num_stages=1
             --only CHUNKS=1,2 --only SPLIT=1,2 --only num_warps=2,4,8)
    step exhaustive_tilelang "${EXH_TL_TIMEOUT:-120}" $TUNER tune mamba2_chunk_cumsum_tilelang \
      -w mamba2-780m-b1-s4k -w mamba2-2p7b-b2-s32k-dt-bias --exhaustive "${TL_ONLY[@]}" --samples 100 \
      --device cuda --no-comparators --db "$EXH_DB"
    step exhaustive_triton "${EXH_TR_TIMEOUT:-120}" $TUNER tune mamba2_chunk_cumsum -w mamba2-780m-b1-s4k \
      -w mamba2-1p3b-b8-s2k-dt-bias -w mamba2-2p7b-b2-s32k-dt-bias --exhaustive "${TR_ONLY[@]}" --samples 100 \
      --device cuda --no-comparators --db "$EXH_DB"
    cp "$H/exhaustive_chunk_cumsum.db" "$OUT/"
    fi
    ;;
  mimo)
    SELECT=(); for w in ${VERIFY_WORKLOADS:-${WORKLOADS:-}}; do SELECT+=(-w "$w"); done
    [[ ${#SELECT[@]} -eq 0 ]] && SELECT=(--all-workloads)
    MIMO_DB="sqlite:///$MIMO_STORE"
    WARM_SELECT=${VERIFY_WORKLOADS:-${WORKLOADS:-}}  # the shapes verified (default: all)
    if [[ ${WARM:-1} == 1 ]]; then
      step warm "${WARM_TIMEOUT:-240}" python3 "$H/warm_mimo.py" --workers 16 --timeout "$(( ${WARM_TIMEOUT:-240} - 10 ))" \
        --best-db "$MIMO_DB" ${WARM_SELECT:+--workloads $WARM_SELECT} \
        $([[ ${COMPARATORS:-1} == 0 ]] && echo --no-comparator)
    fi
    # Cache probe: a fresh process builds and runs the comparator of the first shape; with TileLang's disk
    # cache working this takes seconds, not the minutes of a compile. PROBE=0 skips it (a warm machine whose
    # final rounds just loaded the comparators from that cache).
    # shellcheck disable=SC2086
    set -- ${VERIFY_WORKLOADS:-${WORKLOADS:-mimo-n16-p64-r4}}; FIRST=$1
    # COMPARATORS=0 skips it too: the probe builds the TileLang comparator, which that option leaves unbuilt.
    [[ ${PROBE:-1} == 0 || ${COMPARATORS:-1} == 0 ]] || TL_LOG_LEVEL=INFO step cache_probe "${PROBE_TIMEOUT:-200}" python3 -c "
import sys, time; sys.path.insert(0, '$H'); t0 = time.perf_counter()
import torch; from mimo_probe import build_candidate; from tuner import registry
t = registry.get('mamba3_mimo_bwd'); shape = t.workload('$FIRST'); inputs = t.make_inputs(shape, 'cuda', 0)
out = t.allocate_outputs(shape, inputs); t1 = time.perf_counter(); k = build_candidate(t, shape, 'tilelang')
k(inputs, out); torch.cuda.synchronize(); t2 = time.perf_counter()
for _ in range(5): k(inputs, out)
torch.cuda.synchronize(); t3 = time.perf_counter()
print(f'cache probe $FIRST: imports+inputs {t1-t0:.1f}s, build+first call {t2-t1:.1f}s, 5 more calls {t3-t2:.1f}s')"
    ls "$TILELANG_CACHE_DIR" | wc -l | sed 's/^/tilelang cache entries: /' | tee -a "$W/cache_probe.log"
    # VERIFY_TIMEOUT, when given, is the verify's limit as asked (at least 1 s); else what is left of the
    # BUDGET, when that is 120 s or more (less would be cut before its first shape is done).
    LEFT=${VERIFY_TIMEOUT:-$(left)}; FLOOR=120; [[ -n ${VERIFY_TIMEOUT:-} ]] && FLOOR=1
    if (( LEFT < FLOOR )); then  # `timeout 0` would not limit it, a negative one fails: skip, and say so
      FROM="left of BUDGET=${BUDGET:-570}"; [[ -n ${VERIFY_TIMEOUT:-} ]] && FROM="VERIFY_TIMEOUT"
      echo "== verify_mimo skipped: a limit of ${LEFT}s ($FROM; at least ${FLOOR}s needed)" | tee "$W/verify_mimo.log"
    else
      step verify_mimo "$LEFT" $TUNER verify mamba3_mimo_bwd "${SELECT[@]}" --processes "${PROCESSES:-5}" --samples 30 \
        ${COMPARATOR_PROCESSES:+--comparator-processes $COMPARATOR_PROCESSES} $([[ ${COMPARATORS:-1} == 0 ]] && echo --no-comparators) \
        --stand-ins "${STAND_INS:-3}" \
        --timeout 240 --device cuda \
        --db "$MIMO_DB" --json
    fi
    cp "$MIMO_STORE" "$OUT/"
    ;;
  mimo-sweep)
    MIMO_ONLY=(--only variant=split,split2 --only chunk_rows=16,32,64 --only num_warps=2,4,8 --only num_stages=1,2
               --only prec=lowp3,tf32 --only prec_rot=lowp3 --only block_n=16 --only scan_block=512
               --only scan_chunks=4 --only group_chunks=4 --only qk_warps=same)
    SWEEP=${SWEEP_WORKLOADS:-mimo-n128-p64-r2}
    if [[ ${WARM:-1} == 1 ]]; then  # TileLang (minutes per shape) and the default and seeds, all in parallel
      # WARM_WORKLOADS (default: the sweep's) can name shapes of later calls on the same warm machine;
      # COMPARATOR_ONLY=1 builds only their TileLang comparators (their studies hold the default and seeds).
      step warm "${WARM_TIMEOUT:-240}" python3 "$H/warm_mimo.py" --workers 16 \
        --timeout "$(( ${WARM_TIMEOUT:-240} - 10 ))" --workloads ${WARM_WORKLOADS:-$SWEEP} \
        ${COMPARATOR_ONLY:+--comparator-only}
    elif [[ ${WARM:-1} == bg ]]; then
      # The TileLang comparators of WARM_WORKLOADS (default: the sweep's) built in the background, one process
      # each, while the first sweep runs (its studies hold their default and seeds already): the final rounds
      # then load them from the cache. They share the host's cores with the sweep's compile pool; the
      # device times of the sweep (CUPTI) are not affected by the host's load.
      echo "== warm in the background: ${WARM_WORKLOADS:-$SWEEP}"
      timeout "${WARM_TIMEOUT:-300}" python3 "$H/warm_mimo.py" --workers 8 --comparator-only \
        --timeout "$(( ${WARM_TIMEOUT:-300} - 10 ))" --workloads ${WARM_WORKLOADS:-$SWEEP} > "$W/warm_bg.log" 2>&1 &
      WARM_PID=$!
    elif [[ ${WARM:-1} != 0 ]]; then
      echo "error: WARM must be 1, bg or 0, got ${WARM}" >&2; exit 2
    elif [[ -z $(find .cache/tilelang -mindepth 1 -print -quit 2>/dev/null) ]]; then
      # WARM=0 assumes a warm machine from an earlier call; on a fresh one each final round builds mamba_ssm's
      # TileLang backward (140-190 s) inside its TUNE_TIMEOUT and is killed before publishing (2026-12-02,
      # thirteenth session: three rounds killed at 150 s; 2026-12-04, twentieth session: three more, the
      # machine having gone idle between two calls). So build the sweep's TileLang comparators first, as
      # WARM=1 COMPARATOR_ONLY=1 does (~150 s for up to five shapes in parallel; COLD_OK=1: don't, each final
      # round builds its own). In the background, as WARM=bg does, they would not be ready for the first
      # final round (a 48-config sweep takes ~90 s) and that round would build TileLang a second time.
      if [[ ${COLD_OK:-0} == 1 ]]; then
        echo "warning: WARM=0 on a fresh machine (empty TileLang cache), COLD_OK=1: each final round builds" \
             "TileLang (140-190 s) within TUNE_TIMEOUT=${TUNE_TIMEOUT:-240}" | tee "$W/warm_warning.txt" >&2
      else
        echo "warning: WARM=0 but the TileLang cache is empty (a fresh machine): building the comparators of" \
             "$SWEEP first (COLD_OK=1 skips that)" | tee "$W/warm_warning.txt" >&2
        step warm "${WARM_TIMEOUT:-240}" python3 "$H/warm_mimo.py" --workers 16 --comparator-only \
          --timeout "$(( ${WARM_TIMEOUT:-240} - 10 ))" --workloads $SWEEP
      fi
    fi
    for w in $SWEEP; do
      # Each shape gets TUNE_TIMEOUT or what is left of the call's BUDGET, whichever is less; its sweep stops
      # starting trials RESERVE_S (default 150: a batch of 16 compiles, then the final round with TileLang)
      # before that, so the final round runs and publishes instead of being killed. A MIMO final round took
      # 83-133 s on the H200 (2026-12-03, fourteenth session; more with a cold Triton cache), so a
      # RESERVE_S below 150 or a final-only TUNE_TIMEOUT below ~150 s got rounds killed before publishing.
      # Fifteenth session: prebuild 18-49 s + measuring call 59-92 s, then ~20 s waiting for the child
      # processes' exit after publishing (15 s compile pool + 5 s measuring process; 3 s and about none
      # since commit 3f526a0); the measuring call's parts are printed under each final-round table.
      LIMIT=$(left); (( LIMIT > ${TUNE_TIMEOUT:-240} )) && LIMIT=${TUNE_TIMEOUT:-240}
      if (( LIMIT - ${RESERVE_S:-150} < 30 )); then
        echo "== tune_$w skipped: ${LIMIT}s left of BUDGET=${BUDGET:-570}" | tee "$W/tune_$w.log"; continue
      fi
      # FINAL_ONLY=1: no new trial, only the final round (finalists, incumbent, default, TileLang).
      TIME_LIMIT=$(( LIMIT - ${RESERVE_S:-150} )); [[ ${FINAL_ONLY:-0} == 1 ]] && TIME_LIMIT=0.001
      # SWEEP_ONLY="--only NAME=V1,V2 …": instead of TRIALS sampled trials, measure that subspace (`--exhaustive`:
      # the configs the study lacks), then the final round as usual.
      # SWEEP_ONLY_<workload with - as _>, e.g. SWEEP_ONLY_mimo_n16_p64_r4, overrides SWEEP_ONLY for that shape
      # (shapes whose subspaces differ, such as R8 or N16, in one call).
      ONLY_VAR="SWEEP_ONLY_${w//-/_}"; ONLY=${!ONLY_VAR:-${SWEEP_ONLY:-}}
      if [[ -n $ONLY ]]; then read -ra HOW <<< "--exhaustive $ONLY"; else HOW=(--trials "${TRIALS:-40}"); fi
      step "tune_$w" "$LIMIT" $TUNER tune mamba3_mimo_bwd -w "$w" "${HOW[@]}" \
        --time-limit "$TIME_LIMIT" --samples 30 --finalists 3 --timeout "${CANDIDATE_TIMEOUT:-240}" --device cuda \
        --seed 1 --db "sqlite:///$MIMO_STORE"
      cp "$MIMO_STORE" "$OUT/"
    done
    # A background warm still building after the sweeps builds for nobody in this call: stop it (the logs
    # below must be packed within the call's time).
    [[ -n ${WARM_PID:-} ]] && kill "$WARM_PID" 2>/dev/null; wait
    if (( ${EXH_TIMEOUT:-300} > 1 )); then
      step exhaustive_mimo "${EXH_TIMEOUT:-300}" $TUNER tune mamba3_mimo_bwd -w mimo-n128-p64-r2 -w mimo-n64-p64-r4 \
        --exhaustive "${MIMO_ONLY[@]}" --samples 30 --timeout 240 --device cuda --no-comparators \
        --db "sqlite:///$PWD/$H/exhaustive_mimo_bwd.db"
      cp "$H/exhaustive_mimo_bwd.db" "$OUT/"
    fi
    ;;
  mimo-profile)
    for w in ${PROFILE_WORKLOADS:-mimo-n128-p64-r8 mimo-n128-p64-r1}; do
      profile "mimo_$w" "$w" mamba3_mimo_bwd --workload "$w" --served "sqlite:///$MIMO_STORE"
    done
    ;;
  cumsum-profile)
    # The chunk cumsum's served best beside mamba_ssm as users call it and the elementwise kernel of its bytes,
    # on each of PROFILE_SHAPES (default: 2p7b, the row furthest from the copy, in fp16 and on mamba_ssm's fp32
    # contract); PROFILE_LINES names the comparator lines (default: the wrapper and the 1024-thread ceiling). A
    # comparator runs on its own contract: mamba_ssm's wrapper writes fp32 outputs whatever the shape's dtype,
    # and autotunes in each process (its BLOCK_SIZE_H can differ between two profiles: the grid says which).
    export PROFILE_MIN_US=${PROFILE_MIN_US:-0.5}  # the kernels run 2-20 us
    for s in ${PROFILE_SHAPES:-B=2,S=32768,H=80,has_bias=true,dtype=float16 B=2,S=32768,H=80,has_bias=true,dtype=float32}; do
      tag=$(echo "$s" | tr -cd '[:alnum:]=' | tr '=' '-')
      profile "cumsum_${tag}_best" "cumsum_${tag}_best" mamba2_chunk_cumsum_tilelang --shape "$s" --served "$CUMSUM_DB"
      for line in ${PROFILE_LINES:-mamba_ssm-wrapper ceiling-block1024}; do
        profile "cumsum_${tag}_$line" "cumsum_${tag}_$line" mamba2_chunk_cumsum_tilelang --shape "$s" --comparator "$line"
      done
    done
    ;;
  unseen)
    # TUNE=0: no tuning, the served configs measured as the store serves them (a store changed without
    # measuring, e.g. by `tuner rejudge --apply`)
    # shellcheck disable=SC2046
    [[ ${TUNE:-1} == 0 ]] || step tune_unseen "${TUNE_TIMEOUT:-200}" $TUNER tune mamba2_chunk_cumsum_tilelang $(python3 benchmarks/unseen_shapes.py tune-args) \
      --trials "${TRIALS:-24}" ${TIME_LIMIT:+--time-limit "$TIME_LIMIT"} --samples 100 --finalists 3 --device cuda \
      --seed 7 --db "$CUMSUM_DB"
    step measure_unseen "${MEASURE_TIMEOUT:-260}" python3 benchmarks/unseen_shapes.py measure --db "$CUMSUM_DB" \
      --samples 100 --json "$W/unseen_shapes.json" --md "$W/unseen_shapes.md"
    cp "$W/unseen_shapes.json" "$W/unseen_shapes.md" "$OUT/" 2>/dev/null
    cp "$H/chunk_cumsum.db" "$OUT/"
    if [[ ${WORKERS_AUTO:-1} == 1 ]]; then  # WORKERS_AUTO=0: the tune and measure steps alone
    # Issue 18 on one GPU: `tuner serve --workers auto` starts one worker per visible GPU (here one), pinned to it.
    export TUNER_HOME="$W/home"; WDB="sqlite:///$W/workers.db"; PORT=8765
    $TUNER serve --workers auto --device cuda --db "$WDB" --port $PORT --log-level warning > "$W/serve_auto.log" 2>&1 &
    SERVE=$!
    for _ in $(seq 60); do curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 1; done
    T0=$(date +%s)
    JOB=$($TUNER submit mamba2_chunk_cumsum -w mamba2-780m-b1-s4k --trials 12 --samples 50 --no-comparators \
          --url "http://127.0.0.1:$PORT" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['id'])")
    echo "job $JOB"
    for _ in $(seq 150); do
      nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader >> "$W/nvidia_smi_apps.txt"
      STATE=$($TUNER status "$JOB" --url "http://127.0.0.1:$PORT" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['state'])")
      [[ $STATE == done || $STATE == failed || $STATE == cancelled ]] && break; sleep 1
    done
    echo "job $JOB $STATE after $(( $(date +%s) - T0 )) s" | tee "$W/workers_auto.txt"
    $TUNER status "$JOB" --url "http://127.0.0.1:$PORT" --json > "$W/workers_auto_status.json"
    curl -s "http://127.0.0.1:$PORT/v1/workers" > "$W/workers_auto_workers.json"
    kill -TERM $SERVE; wait $SERVE
    python3 - "$W/workers.db" <<'PY' | tee -a "$W/workers_auto.txt"
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
cols = [r[1] for r in con.execute("pragma table_info(tuner_measurements)")]
print("measurement columns:", ",".join(cols))
for row in con.execute("select device_index, device_uuid, count(*) from tuner_measurements group by 1, 2"):
    print("device_index, uuid, measurements:", row)
PY
    nvidia-smi --query-gpu=index,uuid --format=csv,noheader | tee -a "$W/workers_auto.txt"
    sort -u "$W/nvidia_smi_apps.txt" | head -20 | tee -a "$W/workers_auto.txt"
    fi
    ;;
  *) echo "unknown phase $PHASE" >&2; exit 2 ;;
esac
tar -cJf "$OUT/$PHASE.tar.xz" -C "$W" .
