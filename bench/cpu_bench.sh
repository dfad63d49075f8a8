#!/usr/bin/env bash
# The CPU benchmark of issue 12, side by side in one run: our trainer against
# eager PyTorch (bench/torch_llama_cpu.py, Debian's python3-torch with
# OpenBLAS) on m8 and stories15m (bench/configs/), F32 and BF16, without and
# with activation checkpointing, at 1 process (all cores) and at 2 ranks; plus
# the large-GEMM peak of both libraries (bench/gemm_peak.cpp, torch.matmul), so
# every row shows tokens/s, ours / peer and the fraction of the peak.
#
#   bench/cpu_bench.sh                        # ~15 min on a 2-core machine; table at the end
#   bench/cpu_bench.sh --quick                # ~2-3 min smoke run (1 repeat, 1 timed step per run)
#   bench/cpu_bench.sh --build build-bench --repeats 5 --out /tmp/cb
#
# Every case runs --repeats times, interleaved (round 1 runs every case once,
# then round 2, ...), so a burst of load from elsewhere hits all cases alike
# instead of one. A run's figure is the median of its timed steps; the table
# shows the median of the runs and [min-max] over the runs.
#
#   ours, 1 process   build/trainer --config C --set train.threads=0 (all cores of the host)
#   ours, 1 thread    the same with --set train.threads=1: the single-threaded speed the 1-process
#                     row is compared with (issue 12: one process >= 1.7x its single-threaded speed)
#   ours, 2 ranks     scripts/launch -np 2 --map-by core --bind-to core build/trainer ... (1 core, 1 thread each)
#                     tokens/s from logging.metrics_file (JSON lines, one per step), first --warmup steps dropped
#   peer, 1 process   torch_llama_cpu.py --threads <cores>, micro-batch = global batch
#   peer, "2 ranks"   the same at 2 threads (issue 12's convention: 2 threads, micro-batch = global batch);
#                     on a 2-core machine that is the 1-process run, which then runs once per round and
#                     fills both rows
#   peaks             gemm_peak and torch_llama_cpu.py --gemm-peak, 2048^3, F32 and BF16, at <cores> threads,
#                     once per round; the peak of a dtype is the better library's median
#   fraction of peak  tokens/s * FLOPs per token (metrics/flops.h) / the peak of the row's dtype
#
# Options (defaults in brackets):
#   --build DIR          build directory holding trainer and gemm_peak [build]; both targets are
#                        (re)built there first unless --no-build
#   --repeats R          rounds [3]
#   --quick              1 round, 1 warm-up and 1 timed step per run
#   --models LIST        comma-separated from m8, stories15m [both]
#   --warmup N           untimed steps per run, ours and peer [2]
#   --steps-m8 N         timed steps per m8 run [4]
#   --steps-stories N    timed steps per stories15m run [2]
#   --ours-set KEY=VALUE one more --set for every trainer run, 1 process and 2 ranks (repeatable),
#                        e.g. fsdp.forward_prefetch=false
#   --run-timeout S      stop a run that takes longer than S seconds and record it as failed [900]
#   --omp-wait-policy P  default (each side's own: ours a 2000-round spin, torch libgomp's long spin), active or passive
#   --python PY          the Python with torch [/usr/bin/python3]
#   --out DIR            logs, metrics, results.jsonl, table.md [bench/out/cpu]
set -uo pipefail  # no -e: a failed run is recorded as such and the next one runs

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1

BUILD=build
REPEATS=3
WARMUP=2
STEPS_M8=4
STEPS_STORIES=2
MODELS=m8,stories15m
OMP_POLICY=default
PY=/usr/bin/python3
OUT=bench/out/cpu
BUILD_FIRST=1
QUICK=0
OURS_SET=()
RUN_TIMEOUT=900
invocation="bench/cpu_bench.sh $*"

usage() { sed -n '/^# Options/,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --build) BUILD=$2; shift ;;
    --repeats) REPEATS=$2; shift ;;
    --quick) QUICK=1 ;;
    --models) MODELS=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --steps-m8) STEPS_M8=$2; shift ;;
    --steps-stories) STEPS_STORIES=$2; shift ;;
    --ours-set) OURS_SET+=(--set "$2"); shift ;;
    --run-timeout) RUN_TIMEOUT=$2; shift ;;
    --omp-wait-policy) OMP_POLICY=$2; shift ;;
    --python) PY=$2; shift ;;
    --out) OUT=$2; shift ;;
    --no-build) BUILD_FIRST=0 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "cpu_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if ((QUICK)); then
  REPEATS=1 WARMUP=1 STEPS_M8=1 STEPS_STORIES=1
fi
for n in REPEATS STEPS_M8 STEPS_STORIES RUN_TIMEOUT; do
  [[ ${!n} =~ ^[1-9][0-9]*$ ]] || { echo "cpu_bench.sh: $n must be a positive integer, got '${!n}'" >&2; exit 2; }
done
[[ $WARMUP =~ ^[0-9]+$ ]] || { echo "cpu_bench.sh: --warmup must be >= 0, got '$WARMUP'" >&2; exit 2; }
case $OMP_POLICY in
  default) ;;
  active | passive) export OMP_WAIT_POLICY=${OMP_POLICY^^} ;;
  *) echo "cpu_bench.sh: --omp-wait-policy must be default, active or passive" >&2; exit 2 ;;
esac
IFS=, read -r -a models <<<"$MODELS"
for m in "${models[@]}"; do
  [[ -f bench/configs/$m.yaml ]] || { echo "cpu_bench.sh: no bench/configs/$m.yaml (--models)" >&2; exit 2; }
done

cores=$(nproc)
logs="$OUT/logs"
results="$OUT/results.jsonl"
mkdir -p "$logs" && : >"$results" || exit 1
t_begin=$(date +%s)

# --- build and preflight -------------------------------------------------------------------

if ((BUILD_FIRST)); then
  [[ -f $BUILD/CMakeCache.txt ]] || {
    echo "cpu_bench.sh: $BUILD is not a configured build directory; configure it first, e.g." >&2
    echo "  cmake -S . -B $BUILD -G Ninja -DST_WITH_CUDA=OFF" >&2
    exit 1
  }
  echo "building trainer and gemm_peak in $BUILD ..."
  cmake --build "$BUILD" --target trainer gemm_peak >"$logs/build.log" 2>&1 ||
    { tail -20 "$logs/build.log" >&2; echo "cpu_bench.sh: build failed ($logs/build.log)" >&2; exit 1; }
fi
for exe in trainer gemm_peak; do
  [[ -x $BUILD/$exe ]] || { echo "cpu_bench.sh: $BUILD/$exe missing (cmake --build $BUILD --target $exe)" >&2; exit 1; }
done
"$PY" -c 'import torch, yaml' 2>/dev/null ||
  { echo "cpu_bench.sh: $PY cannot import torch and yaml (apt-get install python3-torch python3-yaml)" >&2; exit 1; }

# --- one run of each kind: append one JSON line to $results ----------------------------------

steps_of() { [[ $1 == m8 ]] && echo "$STEPS_M8" || echo "$STEPS_STORIES"; }

# record KIND LOG JSON-FIELDS...: the last JSON line of LOG (or a failure) with the case's fields.
record() {
  local kind=$1 log=$2 fields=$3 rc=$4
  "$PY" - "$kind" "$log" "$fields" "$rc" "$WARMUP" >>"$results" <<'EOF'
import json, sys
kind, log, fields, rc, warmup = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
out = dict(kind=kind, log=log, **fields)
if kind == "ours":
    # The trainer's metrics file: one JSON object per step (metrics/metrics.cpp); drop the warm-up steps.
    try:
        steps = [json.loads(line) for line in open(fields["metrics"]) if line.strip()]
        steps = [s for s in steps if "event" not in s]  # the line where the run began is no step
    except OSError:
        steps = []
    rates = sorted(s["tokens_per_s"] for s in steps if s["step"] > warmup)
    if rc == 0 and rates:
        n = len(rates)
        out.update(tokens_per_s=rates[n // 2] if n % 2 else (rates[n // 2 - 1] + rates[n // 2]) / 2,
                   tokens_per_s_min=rates[0], tokens_per_s_max=rates[-1], timed_steps=n,
                   last_loss=steps[-1]["loss"])
    else:
        out["failed"] = f"exit {rc}, {len(rates)} timed step(s) in the metrics file"
else:
    lines = [l for l in open(log) if l.startswith("{")]
    if rc == 0 and lines:
        out["result"] = [json.loads(l) for l in lines] if kind.startswith("peak") else json.loads(lines[-1])
    else:
        out["failed"] = f"exit {rc}"
print(json.dumps(out))
EOF
  if [[ $rc -ne 0 ]]; then echo "    FAILED (exit $rc): $log" >&2; tail -3 "$log" >&2; fi
}

# ours MODEL PRECISION RECOMPUTE PROCS ROUND [THREADS]  (THREADS: train.threads, 0 = all the rank's cores)
ours() {
  local model=$1 prec=$2 rc_mode=$3 procs=$4 round=$5 threads=${6:-0}
  local tag="ours-$model-$prec-$rc_mode-np$procs-t$threads-r$round"
  local metrics="$logs/$tag.metrics.jsonl" log="$logs/$tag.log" steps
  steps=$((WARMUP + $(steps_of "$model")))
  rm -f "$metrics"
  local cmd=("$BUILD/trainer" --config "bench/configs/$model.yaml" --set "train.threads=$threads"
    --set "train.steps=$steps" --set "fsdp.mixed_precision.param_dtype=$prec"
    --set "fsdp.activation_checkpointing.mode=$rc_mode" --set "logging.metrics_file=$metrics" "${OURS_SET[@]}")
  ((procs > 1)) && cmd=(scripts/launch -np "$procs" --map-by core --bind-to core "${cmd[@]}")
  echo "  ${cmd[*]}" >"$log"
  timeout -k 30 "$RUN_TIMEOUT" "${cmd[@]}" >>"$log" 2>&1
  record ours "$log" "$(printf '{"model":"%s","precision":"%s","recompute":"%s","procs":%d,"threads":%d,"round":%d,"metrics":"%s"}' \
    "$model" "$prec" "$rc_mode" "$procs" "$threads" "$round" "$metrics")" $?
}

# peer MODEL PRECISION RECOMPUTE THREADS ROUND
peer() {
  local model=$1 prec=$2 rc_mode=$3 threads=$4 round=$5
  local tag="peer-$model-$prec-$rc_mode-t$threads-r$round" log
  log="$logs/$tag.log"
  local cmd=("$PY" bench/torch_llama_cpu.py --config "bench/configs/$model.yaml" --dtype "$prec" --threads "$threads"
    --warmup "$WARMUP" --steps "$(steps_of "$model")")
  [[ $rc_mode == full ]] && cmd+=(--recompute)
  echo "  ${cmd[*]}" >"$log"
  timeout -k 30 "$RUN_TIMEOUT" "${cmd[@]}" >>"$log" 2>&1
  record peer "$log" "$(printf '{"model":"%s","precision":"%s","recompute":"%s","threads":%d,"round":%d}' \
    "$model" "$prec" "$rc_mode" "$threads" "$round")" $?
}

peaks() {
  local round=$1
  timeout -k 30 "$RUN_TIMEOUT" "$BUILD/gemm_peak" --threads "$cores" >"$logs/peak-ours-r$round.log" 2>&1
  record peak-ours "$logs/peak-ours-r$round.log" "{\"round\":$round}" $?
  timeout -k 30 "$RUN_TIMEOUT" "$PY" bench/torch_llama_cpu.py --gemm-peak --threads "$cores" \
    >"$logs/peak-peer-r$round.log" 2>&1
  record peak-peer "$logs/peak-peer-r$round.log" "{\"round\":$round}" $?
}

# --- the rounds ------------------------------------------------------------------------------

# The peer's "2 ranks" row runs at 2 threads; when that is also the 1-process
# thread count, one run fills both rows.
peer_threads=("$cores")
((cores != 2)) && peer_threads+=(2)

echo "cpu_bench: $REPEATS round(s), models ${models[*]}, warm-up $WARMUP, timed steps m8 $STEPS_M8 /" \
  "stories15m $STEPS_STORIES, $cores cores, out $OUT"
for ((round = 1; round <= REPEATS; round++)); do
  echo "round $round/$REPEATS ($(($(date +%s) - t_begin)) s)"
  peaks "$round"
  for model in "${models[@]}"; do
    for prec in f32 bf16; do
      for rc_mode in none full; do
        echo "  $model $prec recompute=$rc_mode"
        ours "$model" "$prec" "$rc_mode" 1 "$round"
        ((cores > 1)) && ours "$model" "$prec" "$rc_mode" 1 "$round" 1
        for t in "${peer_threads[@]}"; do peer "$model" "$prec" "$rc_mode" "$t" "$round"; done
        ours "$model" "$prec" "$rc_mode" 2 "$round"
      done
    done
  done
  if ((round == 1 && REPEATS > 1)); then
    per_round=$(($(date +%s) - t_begin))
    echo "round 1 took $per_round s; expect about $((per_round * REPEATS / 60)) min in all"
  fi
done
elapsed=$(($(date +%s) - t_begin))

# --- the table -------------------------------------------------------------------------------

machine=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
isa=$(grep -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')"
"$PY" - "$results" "$cores" "$machine" "$isa" "$commit" "$invocation" "$elapsed" "$BUILD" "$WARMUP" \
  "$PY" "$OMP_POLICY" >"$OUT/table.md" <<'EOF'
import json, statistics, sys
path, cores, machine, isa, commit, invocation, elapsed, build, warmup, py, omp_policy = sys.argv[1:]
cores = int(cores)
rows = [json.loads(line) for line in open(path)]

def spread(values):
    if not values:
        return None
    return statistics.median(values), min(values), max(values)

# Peaks: the median over rounds per library and dtype; a dtype's peak is the better library's.
peak = {}
lib_peak = {}
for lib in ("ours", "peer"):
    for dtype in ("f32", "bf16"):
        v = [r["gflops"] for row in rows if row["kind"] == f"peak-{lib}" and "result" in row
             for r in row["result"] if r["dtype"] == dtype]
        lib_peak[lib, dtype] = statistics.median(v) if v else None
for dtype in ("f32", "bf16"):
    known = [g for g in (lib_peak["ours", dtype], lib_peak["peer", dtype]) if g]
    peak[dtype] = max(known) if known else None

flops = {}  # model -> FLOPs per token (the peer's JSON carries metrics/flops.h's count)
for row in rows:
    if row["kind"] == "peer" and "result" in row:
        flops[row["model"]] = row["result"]["flops_per_token"]

def fmt(s):
    return "FAILED" if s is None else f"{s[0]:,.0f} [{s[1]:,.0f}-{s[2]:,.0f}]"

def pct(tok, model, dtype):
    if tok is None or model not in flops or not peak[dtype]:
        return "n/a"
    return f"{100 * tok * flops[model] / 1e9 / peak[dtype]:.0f}%"

models = list(dict.fromkeys(r["model"] for r in rows if r["kind"] == "ours"))
print("| model | precision | recompute | procs | ours tok/s (median [min-max]) | peer tok/s | ours / peer "
      "| ours % of peak | peer % of peak |")
print("|---|---|---|--:|--:|--:|--:|--:|--:|")
for model in models:
    for prec in ("f32", "bf16"):
        for rc in ("none", "full"):
            for procs in (1, 2):
                key = lambda r: r["model"] == model and r["precision"] == prec and r["recompute"] == rc
                ours = spread([r["tokens_per_s"] for r in rows if r["kind"] == "ours" and key(r) and r["procs"] == procs
                               and r.get("threads", 0) == 0 and "tokens_per_s" in r])
                threads = cores if procs == 1 else 2
                peer = spread([r["result"]["tokens_per_s"] for r in rows
                               if r["kind"] == "peer" and key(r) and r["threads"] == threads and "result" in r])
                ratio = f"{ours[0] / peer[0]:.2f}x" if ours and peer else "n/a"
                print(f"| {model} | {prec} | {rc} | {procs} | {fmt(ours)} | {fmt(peer)} | {ratio} "
                      f"| {pct(ours and ours[0], model, prec)} | {pct(peer and peer[0], model, prec)} |")

print()
print(f"One process, all {cores} cores (train.threads=0) against one thread (train.threads=1), ours:")
print()
print("| model | precision | recompute | 1 thread tok/s | all cores tok/s | speed-up |")
print("|---|---|---|--:|--:|--:|")
for model in models:
    for prec in ("f32", "bf16"):
        for rc in ("none", "full"):
            def ours_at(threads):
                return spread([r["tokens_per_s"] for r in rows if r["kind"] == "ours" and r["model"] == model
                               and r["precision"] == prec and r["recompute"] == rc and r["procs"] == 1
                               and r.get("threads", 0) == threads and "tokens_per_s" in r])
            one, every = ours_at(1), ours_at(0)
            if one is None and every is None:
                continue
            up = f"{every[0] / one[0]:.2f}x" if one and every else "n/a"
            print(f"| {model} | {prec} | {rc} | {fmt(one)} | {fmt(every)} | {up} |")

print()
print("GEMM peak, 2048^3 at %d threads, GFLOP/s (median over rounds; C is F32 for ours, the operand dtype for "
      "torch):" % cores)
for dtype in ("f32", "bf16"):
    o, p = lib_peak["ours", dtype], lib_peak["peer", dtype]
    print(f"- {dtype}: ours (ops::gemm) {o and f'{o:.0f}'}, torch.matmul {p and f'{p:.0f}'}; peak used "
          f"{peak[dtype] and f'{peak[dtype]:.0f}'}")
backend = next((r["result"][0].get("backend") for r in rows if r["kind"] == "peak-ours" and "result" in r), "?")
blas = next((r["result"].get("blas") for r in rows if r["kind"] == "peer" and "result" in r), "?")
# The library file behind libblas.so.3 names the BLAS (openblas-pthread/libopenblasp-r0.3.21.so, or blas/ for
# the reference implementation).
blas = next((p for p in blas.split(",") if "openblas" in p.rsplit("/", 1)[-1]), blas.split(",")[0])
blas = "/".join(blas.split("/")[-2:])
torch_version = next((r["result"].get("torch") for r in rows if r["kind"] == "peer" and "result" in r), "?")
rounds = max((r["round"] for r in rows), default=0)
print()
print(f"Machine: {machine}, {cores} cores ({isa.strip()}). Commit {commit}. {rounds} round(s), "
      f"{elapsed} s in all.")
print(f"Ours: {backend}. Peer: torch {torch_version}, BLAS {blas}.")
if "openblas" not in blas:
    print("WARNING: the peer's F32 GEMMs did not run in OpenBLAS (apt-get install libopenblas0-pthread); "
          "its F32 rows say nothing about PyTorch.")
print("OpenMP wait policy: " + ("each side's default (ours GOMP_SPINCOUNT=2000, torch libgomp's 300,000-round spin, then sleep)"
                                if omp_policy == "default" else f"OMP_WAIT_POLICY={omp_policy.upper()} for both"))
failed = [r["log"] for r in rows if "failed" in r]
if failed:
    print(f"FAILED runs ({len(failed)}): " + ", ".join(failed))
print()
print("Commands (C = bench/configs/<model>.yaml, P = f32|bf16, M = none|full, first "
      f"{warmup} step(s) of every run untimed):")
print(f"    {invocation}")
print(f"    {build}/trainer --config C --set train.threads=0 --set fsdp.mixed_precision.param_dtype=P "
      "--set fsdp.activation_checkpointing.mode=M --set train.steps=S --set logging.metrics_file=F")
print(f"    scripts/launch -np 2 --map-by core --bind-to core {build}/trainer ... (the same --set flags)")
print(f"    {py} bench/torch_llama_cpu.py --config C --dtype P [--recompute] --threads T --warmup W --steps N")
print(f"    {build}/gemm_peak --threads {cores};  {py} bench/torch_llama_cpu.py --gemm-peak --threads {cores}")
EOF
echo
cat "$OUT/table.md"
echo
echo "(table in $OUT/table.md, every run's log and metrics in $logs, results in $results)"
