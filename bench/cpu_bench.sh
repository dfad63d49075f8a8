#!/usr/bin/env bash
# The CPU benchmark of issues 12 and 26, side by side in one run: our trainer
# against eager PyTorch (bench/torch_llama_cpu.py, Debian's python3-torch with
# OpenBLAS) on the models of bench/configs/, F32 and BF16, without and with
# activation checkpointing, at 1 process (all cores) and at 2 ranks; plus the
# large-GEMM peak of both libraries (bench/gemm_peak.cpp, torch.matmul), so
# every row shows tokens/s, ours / peer, model FLOP/s, the fraction of the
# peak and the peak memory.
#
#   bench/cpu_bench.sh                        # ~15 min on a 2-core machine; table at the end
#   bench/cpu_bench.sh --quick                # ~2-3 min smoke run (1 repeat, 1 timed step per run)
#   bench/cpu_bench.sh --sweep                # issue 26's size sweep, 2 ranks only; see below
#   bench/cpu_bench.sh --build build-bench --repeats 5 --out /tmp/cb
#
# The size sweep (--sweep): m8, stories15m, stories42m, stories110m (llama2.c's
# shapes; every model 2,048 tokens per step, one micro-batch of 1,024 tokens
# per rank) at 2 ranks only, F32 and BF16, recomputation none and full, ours and
# the peer at 2 threads; small models 2 rounds, stories42m and stories110m 1
# round of 1 warm-up + 2 timed steps. Wall time on the 2-core AMD EPYC kind,
# with OpenBLAS and a quiet machine: about 20 min (round 1 ~16 min, of which
# stories110m ~9 and mostly the peer's F32 runs at ~36 s a step; round 2 ~4),
# an estimate from single steps on a shared machine (ours stories110m F32 ~12 s
# a step, BF16 ~5-8 s), not a measured sweep; the script prints its own
# estimate after round 1. To cut it: --steps stories110m=1, --repeats 1.

# Every case runs --repeats times, interleaved (round 1 runs every case once,
# then round 2, ...), so a burst of load from elsewhere hits all cases alike
# instead of one. A run's figure is the median of its timed steps; the table
# shows the median of the runs and [min-max] over the runs.
#
#   ours, 1 process   build/trainer --config C --set train.threads=0 (all cores of the host)
#   ours, 1 thread    the same with --set train.threads=1: the single-threaded speed the 1-process
#                     row is compared with (issue 12: one process >= 1.7x its single-threaded speed)
#   ours, 2 ranks     scripts/launch -np 2 --map-by core --bind-to core build/trainer ... (1 core, 1 thread each)
#                     tokens/s from logging.metrics_file (JSON lines, one per step), first warm-up steps dropped
#   peer, 1 process   torch_llama_cpu.py --threads <cores>, micro-batch = global batch
#   peer, "2 ranks"   the same at 2 threads (issue 12's convention: 2 threads, micro-batch = global batch);
#                     on a 2-core machine that is the 1-process run, which then runs once per round and
#                     fills both rows
#   peaks             gemm_peak and torch_llama_cpu.py --gemm-peak, 2048^3, F32 and BF16, at <cores> threads,
#                     once per round; the peak of a dtype is the better library's median
#   fraction of peak  tokens/s * FLOPs per token (metrics/flops.h) / the peak of the row's dtype
#   peak memory       ours: the peak RSS of every rank's process (wait4's ru_maxrss, taken by a small
#                     wrapper around each trainer process), the largest rank's; the peer: its one
#                     process's ru_maxrss (it holds the whole model and batch)
#
# Per-model settings. --steps, --warmup and --repeats take N (every model) or
# MODEL=N (that model; repeatable, later ones win). Without them a model's
# timed steps follow its FLOPs per step F (params and FLOPs per token from
# metrics/flops.h's count, times the config's tokens per step): round(4e11 / F),
# at least 2 (m8 4, stories15m, stories42m and stories110m 2); warm-up 2 steps
# when F < 4e11, else 1; repeats 3, or with --sweep 2 when F < 4e11, else 1.
# --quick sets all three to 1; flags given explicitly win over --sweep and --quick.
#
# A peer run that runs out of memory or past --run-timeout is a row that says so
# ("out of memory", "timed out (> S s)"); after a timeout the peer's slower
# runs of that model and precision (recomputation, later rounds) are skipped.
#
# Options (defaults in brackets):
#   --build DIR          build directory holding trainer and gemm_peak [build]; both targets are
#                        (re)built there first unless --no-build
#   --sweep              the size sweep: --models m8,stories15m,stories42m,stories110m --ranks 2
#                        --run-timeout 300, repeats 2 for the small models and 1 for the large
#   --models LIST        comma-separated names of bench/configs/*.yaml [m8,stories15m]
#   --ranks LIST         1 (ours at one process, all cores and one thread; the peer at all cores),
#                        2 (ours at 2 ranks; the peer at 2 threads), or 1,2 [1,2]
#   --repeats R          rounds: N or MODEL=N [3; see Per-model settings]
#   --quick              1 round, 1 warm-up and 1 timed step per run
#   --warmup N           untimed steps per run, ours and peer: N or MODEL=N [2 or 1 by size]
#   --steps N            timed steps per run: N or MODEL=N [by FLOPs per step]
#   --steps-m8 N         the same as --steps m8=N
#   --steps-stories N    the same as --steps stories15m=N
#   --ours-set KEY=VALUE one more --set for every trainer run, 1 process and 2 ranks (repeatable),
#                        e.g. fsdp.forward_prefetch=false
#   --run-timeout S      stop a run that takes longer than S seconds and record it as timed out [900]
#   --peer-max-memory G  the peer's data memory cap in GiB (torch_llama_cpu.py --max-memory) [16]
#   --omp-wait-policy P  default (each side's own: ours a 2000-round spin, torch libgomp's long spin), active or passive
#   --python PY          the Python with torch [/usr/bin/python3]
#   --plan               print each model's tokens per step, warm-up and timed steps and rounds, and exit
#   --any-blas           run even when the peer's torch does not load OpenBLAS (it stops otherwise)
#   --out DIR            logs, metrics, results.jsonl, table.md [bench/out/cpu]
set -uo pipefail  # no -e: a failed run is recorded as such and the next one runs

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1

BUILD=build
SWEEP=0
MODELS=
RANKS=
RUN_TIMEOUT=
PEER_MAX_MEMORY=16
OMP_POLICY=default
PY=/usr/bin/python3
OUT=bench/out/cpu
BUILD_FIRST=1
QUICK=0
ANY_BLAS=0
PLAN_ONLY=0
OURS_SET=()
per_model=()  # "steps|warmup|repeats VALUE" in the order given, applied after the defaults
invocation="bench/cpu_bench.sh $*"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
options() { sed -n '/^# Options/,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --build) BUILD=$2; shift ;;
    --sweep) SWEEP=1 ;;
    --models) MODELS=$2; shift ;;
    --ranks) RANKS=$2; shift ;;
    --repeats) per_model+=("repeats $2"); shift ;;
    --quick) QUICK=1 ;;
    --warmup) per_model+=("warmup $2"); shift ;;
    --steps) per_model+=("steps $2"); shift ;;
    --steps-m8) per_model+=("steps m8=$2"); shift ;;
    --steps-stories) per_model+=("steps stories15m=$2"); shift ;;
    --ours-set) OURS_SET+=(--set "$2"); shift ;;
    --run-timeout) RUN_TIMEOUT=$2; shift ;;
    --peer-max-memory) PEER_MAX_MEMORY=$2; shift ;;
    --omp-wait-policy) OMP_POLICY=$2; shift ;;
    --python) PY=$2; shift ;;
    --out) OUT=$2; shift ;;
    --no-build) BUILD_FIRST=0 ;;
    --any-blas) ANY_BLAS=1 ;;
    --plan) PLAN_ONLY=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "cpu_bench.sh: unknown argument '$1'" >&2; options >&2; exit 2 ;;
  esac
  shift
done
if ((SWEEP)); then
  : "${MODELS:=m8,stories15m,stories42m,stories110m}" "${RANKS:=2}" "${RUN_TIMEOUT:=300}"
fi
: "${MODELS:=m8,stories15m}" "${RANKS:=1,2}" "${RUN_TIMEOUT:=900}"
[[ $RUN_TIMEOUT =~ ^[1-9][0-9]*$ ]] || { echo "cpu_bench.sh: --run-timeout must be a positive integer, got '$RUN_TIMEOUT'" >&2; exit 2; }
[[ $PEER_MAX_MEMORY =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "cpu_bench.sh: --peer-max-memory must be a number of GiB (0: no cap), got '$PEER_MAX_MEMORY'" >&2; exit 2; }
case $RANKS in
  1) ranks=(1) ;; 2) ranks=(2) ;; 1,2 | 2,1) ranks=(1 2) ;;
  *) echo "cpu_bench.sh: --ranks must be 1, 2 or 1,2, got '$RANKS'" >&2; exit 2 ;;
esac
has_rank() { [[ " ${ranks[*]} " == *" $1 "* ]]; }
case $OMP_POLICY in
  default) ;;
  active | passive) export OMP_WAIT_POLICY=${OMP_POLICY^^} ;;
  *) echo "cpu_bench.sh: --omp-wait-policy must be default, active or passive" >&2; exit 2 ;;
esac
IFS=, read -r -a models <<<"$MODELS"
for m in "${models[@]}"; do
  [[ -f bench/configs/$m.yaml ]] || { echo "cpu_bench.sh: no bench/configs/$m.yaml (--models)" >&2; exit 2; }
done
"$PY" -c 'import torch, yaml' 2>/dev/null ||
  { echo "cpu_bench.sh: $PY cannot import torch and yaml (apt-get install python3-torch python3-yaml)" >&2; exit 1; }

# --- per-model settings: defaults from the FLOPs per step, then --quick, then the flags -------------

declare -A STEPS WARMUP REPEATS TOKENS FLOPS
while read -r m tokens flops; do
  TOKENS[$m]=$tokens FLOPS[$m]=$flops
done < <("$PY" - "${models[@]}" <<'EOF'
import sys
sys.path.insert(0, "bench")
import torch_fsdp2 as peer  # the config loader and metrics/flops.h's count
for m in sys.argv[1:]:
    c = peer.load_config(f"bench/configs/{m}.yaml", [])
    tokens = int(c["train"]["global_batch_size"]) * int(c["train"]["seq_len"])
    print(m, tokens, peer.model_flops(c["model"], int(c["train"]["seq_len"]))["flops_per_token"])
EOF
)
for m in "${models[@]}"; do
  [[ -n ${FLOPS[$m]:-} ]] || { echo "cpu_bench.sh: cannot count the FLOPs of bench/configs/$m.yaml" >&2; exit 1; }
  read -r STEPS[$m] WARMUP[$m] REPEATS[$m] < <(awk -v f="${FLOPS[$m]}" -v t="${TOKENS[$m]}" -v sweep="$SWEEP" \
    'BEGIN { s = f * t; n = int(4e11 / s + 0.5); large = s >= 4e11
             print (n < 2 ? 2 : n), (large ? 1 : 2), (sweep ? (large ? 1 : 2) : 3) }')
  ((QUICK)) && STEPS[$m]=1 WARMUP[$m]=1 REPEATS[$m]=1
done
for item in "${per_model[@]}"; do
  read -r what value <<<"$item"
  if [[ $value =~ ^([A-Za-z0-9_.-]+)=([0-9]+)$ ]]; then
    targets=("${BASH_REMATCH[1]}") value=${BASH_REMATCH[2]}
    [[ -f bench/configs/${targets[0]}.yaml ]] || { echo "cpu_bench.sh: --$what ${targets[0]}=$value: no bench/configs/${targets[0]}.yaml" >&2; exit 2; }
    [[ -n ${FLOPS[${targets[0]}]:-} ]] || continue  # a model this run leaves out (--steps-stories with --models m8)
  elif [[ $value =~ ^[0-9]+$ ]]; then
    targets=("${models[@]}")
  else
    echo "cpu_bench.sh: --$what takes N or MODEL=N, got '$value'" >&2; exit 2
  fi
  [[ $what == warmup || $value -ge 1 ]] || { echo "cpu_bench.sh: --$what must be >= 1, got '$value'" >&2; exit 2; }
  for m in "${targets[@]}"; do
    case $what in steps) STEPS[$m]=$value ;; warmup) WARMUP[$m]=$value ;; repeats) REPEATS[$m]=$value ;; esac
  done
done
max_repeats=0
for m in "${models[@]}"; do ((REPEATS[$m] > max_repeats)) && max_repeats=${REPEATS[$m]}; done
if ((PLAN_ONLY)); then
  echo "ranks ${RANKS}, run timeout ${RUN_TIMEOUT} s; model: tokens per step, FLOPs per step, warm-up + timed steps x rounds"
  for m in "${models[@]}"; do
    awk -v m="$m" -v t="${TOKENS[$m]}" -v f="${FLOPS[$m]}" -v w="${WARMUP[$m]}" -v s="${STEPS[$m]}" -v r="${REPEATS[$m]}" \
      'BEGIN { printf "%s: %d, %.3g, %d + %d x %d\n", m, t, t * f, w, s, r }'
  done
  exit 0
fi

# Debian's torch runs its F32 GEMMs in whatever libblas.so.3 is; the reference BLAS makes the peer's
# F32 rows meaningless and so slow (~40 tok/s on m8) that a sweep runs into its timeouts.
blas=$("$PY" -c 'import torch; torch.ones(64, 64) @ torch.ones(64, 64)
print(",".join(sorted({l.split()[-1] for l in open("/proc/self/maps") if "blas" in l.lower() and "/" in l})))')
if [[ ${blas##*/} != *openblas* && ,$blas != *openblas* ]]; then
  if ((ANY_BLAS)); then
    echo "cpu_bench.sh: warning: the peer's torch loads ${blas:-no BLAS}, not OpenBLAS (--any-blas)" >&2
  else
    echo "cpu_bench.sh: the peer's torch loads ${blas:-no BLAS}, not OpenBLAS: its F32 rows would say nothing" \
      "about PyTorch. apt-get install libopenblas0-pthread (or --any-blas to run anyway)" >&2
    exit 1
  fi
fi

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

# The peak RSS of one trainer process: it runs the command as its child (dying with this wrapper, as
# scripts/launch-rank makes a rank die with it; passing on the signals launch-rank forwards) and
# writes wait4's ru_maxrss in bytes to PREFIX.<rank>, then exits as the child did.
rss_wrap="$OUT/peak_rss.py"
cat >"$rss_wrap" <<'EOF'
import ctypes, os, signal, sys
path = f"{sys.argv[1]}.{os.environ.get('OMPI_COMM_WORLD_RANK', '0')}"
pid = os.fork()
if pid == 0:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, lambda n, _frame: os.kill(pid, n))
_, status, usage = os.wait4(pid, 0)
with open(path, "w") as f:
    f.write(f"{usage.ru_maxrss * 1024}\n")
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.waitstatus_to_exitcode(status))
EOF

# --- one run of each kind: append one JSON line to $results ----------------------------------

# record KIND LOG JSON-FIELDS RC SECONDS WARMUP: the run's result (or why it has none) with the case's fields.
record() {
  local kind=$1 log=$2 fields=$3 rc=$4 seconds=$5 warmup=${6:-0}
  "$PY" - "$kind" "$log" "$fields" "$rc" "$seconds" "$warmup" "$RUN_TIMEOUT" >>"$results" <<'EOF'
import glob, json, re, sys
kind, log, fields = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
rc, seconds, warmup, timeout = int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
out = dict(kind=kind, log=log, seconds=seconds, **fields)
try:
    text = open(log, errors="replace").read()
except OSError:
    text = ""

def why():
    if rc == 124 or (rc in (137, 143) and seconds >= timeout):
        return f"timed out (> {timeout} s)"
    if rc == 3 or re.search(r"out of memory|MemoryError|bad_alloc|can't allocate memory|Cannot allocate memory", text):
        return "out of memory"
    return f"exit {rc}"

if kind == "ours":
    # The trainer's metrics file: one JSON object per step (metrics/metrics.cpp); drop the warm-up steps.
    try:
        steps = [json.loads(line) for line in open(fields["metrics"]) if line.strip()]
        steps = [s for s in steps if "event" not in s]  # the line where the run began is no step
    except OSError:
        steps = []
    rates = sorted(s["tokens_per_s"] for s in steps if s["step"] > warmup)
    rss = [int(open(p).read()) for p in sorted(glob.glob(fields["rss"] + ".*"))]
    if rss:
        out.update(peak_rss_bytes=max(rss), peak_rss_bytes_ranks=rss)
    if steps:
        out["allocator_peak_bytes"] = max(s.get("peak_bytes", 0) for s in steps)
    if rc == 0 and rates:
        n = len(rates)
        out.update(tokens_per_s=rates[n // 2] if n % 2 else (rates[n // 2 - 1] + rates[n // 2]) / 2,
                   tokens_per_s_min=rates[0], tokens_per_s_max=rates[-1], timed_steps=n,
                   last_loss=steps[-1]["loss"])
    else:
        out["failed"] = why() + f", {len(rates)} timed step(s) in the metrics file"
else:
    lines = [l for l in text.splitlines() if l.startswith("{")]
    if rc == 0 and lines:
        out["result"] = [json.loads(l) for l in lines] if kind.startswith("peak") else json.loads(lines[-1])
    else:
        out["failed"] = why()
print(json.dumps(out))
EOF
  if [[ $rc -ne 0 ]]; then echo "    FAILED (exit $rc after $seconds s): $log" >&2; tail -3 "$log" >&2; fi
}

# ours MODEL PRECISION RECOMPUTE PROCS ROUND [THREADS]  (THREADS: train.threads, 0 = all the rank's cores)
ours() {
  local model=$1 prec=$2 rc_mode=$3 procs=$4 round=$5 threads=${6:-0}
  local tag="ours-$model-$prec-$rc_mode-np$procs-t$threads-r$round"
  local metrics="$logs/$tag.metrics.jsonl" log="$logs/$tag.log" rss="$logs/$tag.rss" steps t0
  steps=$((WARMUP[$model] + STEPS[$model]))
  rm -f "$metrics" "$rss".*
  local cmd=("$PY" "$rss_wrap" "$rss" "$BUILD/trainer" --config "bench/configs/$model.yaml" --set "train.threads=$threads"
    --set "train.steps=$steps" --set "fsdp.mixed_precision.param_dtype=$prec"
    --set "fsdp.activation_checkpointing.mode=$rc_mode" --set "logging.metrics_file=$metrics" "${OURS_SET[@]}")
  ((procs > 1)) && cmd=(scripts/launch -np "$procs" --map-by core --bind-to core "${cmd[@]}")
  echo "  ${cmd[*]}" >"$log"
  t0=$(date +%s)
  timeout -k 30 "$RUN_TIMEOUT" "${cmd[@]}" >>"$log" 2>&1
  local status=$?
  record ours "$log" "$(printf '{"model":"%s","precision":"%s","recompute":"%s","procs":%d,"threads":%d,"round":%d,"metrics":"%s","rss":"%s"}' \
    "$model" "$prec" "$rc_mode" "$procs" "$threads" "$round" "$metrics" "$rss")" $status $(($(date +%s) - t0)) "${WARMUP[$model]}"
}

# Peer cases given up after a timeout (MODEL-PRECISION: every recomputation mode, every later round) or
# after running out of memory (MODEL-PRECISION-RECOMPUTE: later rounds), with the reason.
declare -A PEER_GAVE_UP

# peer MODEL PRECISION RECOMPUTE THREADS ROUND
peer() {
  local model=$1 prec=$2 rc_mode=$3 threads=$4 round=$5
  local tag="peer-$model-$prec-$rc_mode-t$threads-r$round" log t0 fields
  log="$logs/$tag.log"
  fields=$(printf '{"model":"%s","precision":"%s","recompute":"%s","threads":%d,"round":%d}' \
    "$model" "$prec" "$rc_mode" "$threads" "$round")
  local skip=${PEER_GAVE_UP[$model-$prec]:-${PEER_GAVE_UP[$model-$prec-$rc_mode]:-}}
  if [[ -n $skip ]]; then
    echo "    peer skipped: $skip"
    "$PY" -c 'import json, sys; print(json.dumps(dict(kind="peer", skipped=sys.argv[2], **json.loads(sys.argv[1]))))' \
      "$fields" "$skip" >>"$results"
    return
  fi
  local cmd=("$PY" bench/torch_llama_cpu.py --config "bench/configs/$model.yaml" --dtype "$prec" --threads "$threads"
    --warmup "${WARMUP[$model]}" --steps "${STEPS[$model]}" --max-memory "$PEER_MAX_MEMORY")
  [[ $rc_mode == full ]] && cmd+=(--recompute)
  echo "  ${cmd[*]}" >"$log"
  t0=$(date +%s)
  timeout -k 30 "$RUN_TIMEOUT" "${cmd[@]}" >>"$log" 2>&1
  local status=$? seconds=$(($(date +%s) - t0))
  record peer "$log" "$fields" $status $seconds
  if [[ $status -eq 124 || ( $status -eq 137 && $seconds -ge $RUN_TIMEOUT ) ]]; then
    PEER_GAVE_UP[$model-$prec]="recompute=$rc_mode timed out (> $RUN_TIMEOUT s) in round $round"
  elif [[ $status -eq 3 ]]; then
    PEER_GAVE_UP[$model-$prec-$rc_mode]="out of memory in round $round"
  fi
}

peaks() {
  local round=$1 t0
  t0=$(date +%s)
  timeout -k 30 "$RUN_TIMEOUT" "$BUILD/gemm_peak" --threads "$cores" >"$logs/peak-ours-r$round.log" 2>&1
  record peak-ours "$logs/peak-ours-r$round.log" "{\"round\":$round}" $? $(($(date +%s) - t0))
  t0=$(date +%s)
  timeout -k 30 "$RUN_TIMEOUT" "$PY" bench/torch_llama_cpu.py --gemm-peak --threads "$cores" \
    >"$logs/peak-peer-r$round.log" 2>&1
  record peak-peer "$logs/peak-peer-r$round.log" "{\"round\":$round}" $? $(($(date +%s) - t0))
}

# --- the rounds ------------------------------------------------------------------------------

# The peer's 1-process row runs at all cores, its "2 ranks" row at 2 threads; when those are the
# same thread count, one run fills both rows.
peer_threads=()
has_rank 1 && peer_threads+=("$cores")
has_rank 2 && ! { has_rank 1 && ((cores == 2)); } && peer_threads+=(2)

plan=
for m in "${models[@]}"; do
  "$PY" -c 'import json, sys; m, t, f, s, w, r = sys.argv[1:]
print(json.dumps(dict(kind="model", model=m, tokens_per_step=int(t), flops_per_token=float(f), steps=int(s), warmup=int(w), repeats=int(r))))' \
    "$m" "${TOKENS[$m]}" "${FLOPS[$m]}" "${STEPS[$m]}" "${WARMUP[$m]}" "${REPEATS[$m]}" >>"$results"
  plan+="${plan:+; }$m ${TOKENS[$m]} tok/step, ${WARMUP[$m]}+${STEPS[$m]} steps x ${REPEATS[$m]}"
done
echo "cpu_bench: ranks ${ranks[*]}, $cores cores, out $OUT; per model warm-up+timed steps x rounds: $plan"
declare -A took  # seconds each model's cases took in round 1
for ((round = 1; round <= max_repeats; round++)); do
  echo "round $round/$max_repeats ($(($(date +%s) - t_begin)) s)"
  t_peaks=$(date +%s)
  peaks "$round"
  t_peaks=$(($(date +%s) - t_peaks))
  for model in "${models[@]}"; do
    ((round <= REPEATS[$model])) || continue
    t_model=$(date +%s)
    for prec in f32 bf16; do
      for rc_mode in none full; do
        echo "  $model $prec recompute=$rc_mode"
        if has_rank 1; then
          ours "$model" "$prec" "$rc_mode" 1 "$round"
          ((cores > 1)) && ours "$model" "$prec" "$rc_mode" 1 "$round" 1
        fi
        for t in "${peer_threads[@]}"; do peer "$model" "$prec" "$rc_mode" "$t" "$round"; done
        has_rank 2 && ours "$model" "$prec" "$rc_mode" 2 "$round"
      done
    done
    ((round == 1)) && took[$model]=$(($(date +%s) - t_model))
  done
  if ((round == 1 && max_repeats > 1)); then
    rest=0
    for ((r = 2; r <= max_repeats; r++)); do
      rest=$((rest + t_peaks))
      for m in "${models[@]}"; do ((r <= REPEATS[$m])) && rest=$((rest + took[$m])); done
    done
    per_round=$(($(date +%s) - t_begin))
    echo "round 1 took $per_round s; expect about $(((per_round + rest) / 60)) min in all"
  fi
done
elapsed=$(($(date +%s) - t_begin))

# --- the table -------------------------------------------------------------------------------

machine=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
isa=$(grep -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')"
"$PY" - "$results" "$cores" "$machine" "$isa" "$commit" "$invocation" "$elapsed" "$BUILD" \
  "$PY" "$OMP_POLICY" "${ranks[*]}" "$PEER_MAX_MEMORY" "$rss_wrap" >"$OUT/table.md" <<'EOF'
import json, statistics, sys
path, cores, machine, isa, commit, invocation, elapsed, build, py, omp_policy, ranks, peer_cap, rss_wrap = sys.argv[1:]
cores, ranks = int(cores), [int(r) for r in ranks.split()]
rows = [json.loads(line) for line in open(path)]
model_info = {r["model"]: r for r in rows if r["kind"] == "model"}

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

flops = {m: info["flops_per_token"] for m, info in model_info.items()}  # metrics/flops.h's count

def why(cases):
    """Why a case has no figure: its runs' reasons, once each (e.g. "timed out (> 300 s)")."""
    # A run's own failure says more than a later round skipped because of it.
    reasons = list(dict.fromkeys(r["failed"] for r in cases if "failed" in r)) or \
        list(dict.fromkeys(r["skipped"] for r in cases if "skipped" in r))
    return "; ".join(reasons) if reasons else "FAILED"

def fmt(s, cases):
    return why(cases) if s is None else f"{s[0]:,.0f} [{s[1]:,.0f}-{s[2]:,.0f}]"

def gflops(tok, model):
    return "n/a" if tok is None or model not in flops else f"{tok * flops[model] / 1e9:,.0f}"

def pct(tok, model, dtype):
    if tok is None or model not in flops or not peak[dtype]:
        return "n/a"
    return f"{100 * tok * flops[model] / 1e9 / peak[dtype]:.0f}%"

def mib(values):
    return f"{max(values) / 2**20:,.0f}" if values else "n/a"

models = list(dict.fromkeys(r["model"] for r in rows if r["kind"] == "ours"))
print("| model | precision | recompute | procs | ours tok/s (median [min-max]) | peer tok/s | ours / peer "
      "| ours model GFLOP/s | ours % of peak | peer % of peak | ours peak RSS per rank, MiB | peer peak RSS, MiB |")
print("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
for model in models:
    for prec in ("f32", "bf16"):
        for rc in ("none", "full"):
            for procs in ranks:
                key = lambda r: r["model"] == model and r["precision"] == prec and r["recompute"] == rc
                ours_cases = [r for r in rows if r["kind"] == "ours" and key(r) and r["procs"] == procs
                              and r.get("threads", 0) == 0]
                ours = spread([r["tokens_per_s"] for r in ours_cases if "tokens_per_s" in r])
                threads = cores if procs == 1 else 2
                peer_cases = [r for r in rows if r["kind"] == "peer" and key(r) and r["threads"] == threads]
                peer = spread([r["result"]["tokens_per_s"] for r in peer_cases if "result" in r])
                ratio = f"{ours[0] / peer[0]:.2f}x" if ours and peer else "n/a"
                ours_rss = mib([r["peak_rss_bytes"] for r in ours_cases if "peak_rss_bytes" in r])
                peer_rss = mib([r["result"]["peak_rss_bytes"] for r in peer_cases
                                if "result" in r and "peak_rss_bytes" in r["result"]])
                print(f"| {model} | {prec} | {rc} | {procs} | {fmt(ours, ours_cases)} | {fmt(peer, peer_cases)} | {ratio} "
                      f"| {gflops(ours and ours[0], model)} | {pct(ours and ours[0], model, prec)} "
                      f"| {pct(peer and peer[0], model, prec)} | {ours_rss} | {peer_rss} |")

print()
print("Models (FLOPs per token: metrics/flops.h, 6 x matmul parameters + 12 L T d, recomputation never counted; "
      "warm-up + timed steps per run, x rounds):")
for model in models:
    info = model_info.get(model)
    if info:
        print(f"- {model}: {info['flops_per_token']:.3g} FLOP/token, {info['tokens_per_step']:,} tokens per step, "
              f"{info['warmup']} + {info['steps']} steps x {info['repeats']} round(s)")
print("Peak RSS: ours, the largest of the ranks' processes (wait4's ru_maxrss of each trainer process, the "
      "largest over the rounds); the peer, its one process, which holds the whole model and batch. "
      f"The peer runs with its data memory capped at {peer_cap} GiB (0: no cap).")

if 1 in ranks:
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
                print(f"| {model} | {prec} | {rc} | {fmt(one, [])} | {fmt(every, [])} | {up} |")

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
rounds = max((r.get("round", 0) for r in rows), default=0)
print()
print(f"Machine: {machine}, {cores} cores ({isa.strip()}). Commit {commit}. {rounds} round(s), "
      f"{elapsed} s in all.")
print(f"Ours: {backend}. Peer: torch {torch_version}, BLAS {blas}.")
if "openblas" not in blas:
    print("WARNING: the peer's F32 GEMMs did not run in OpenBLAS (apt-get install libopenblas0-pthread); "
          "its F32 rows say nothing about PyTorch.")
print("OpenMP wait policy: " + ("each side's default (ours GOMP_SPINCOUNT=2000, torch libgomp's 300,000-round spin, then sleep)"
                                if omp_policy == "default" else f"OMP_WAIT_POLICY={omp_policy.upper()} for both"))
failed = [f"{r['log']} ({r['failed']})" for r in rows if "failed" in r]
if failed:
    print(f"FAILED runs ({len(failed)}): " + ", ".join(failed))
skipped = [r for r in rows if "skipped" in r]
if skipped:
    print(f"Skipped peer runs ({len(skipped)}): " + ", ".join(
        f"{r['model']} {r['precision']} recompute={r['recompute']} round {r['round']} ({r['skipped']})" for r in skipped))
print()
print("Commands (C = bench/configs/<model>.yaml, P = f32|bf16, M = none|full, W + S = the model's warm-up + "
      "timed steps above; the first W steps of every run untimed):")
print(f"    {invocation}")
print(f"    {py} {rss_wrap} PREFIX {build}/trainer --config C --set train.threads=0 "
      "--set fsdp.mixed_precision.param_dtype=P --set fsdp.activation_checkpointing.mode=M --set train.steps=W+S "
      "--set logging.metrics_file=F")
print(f"    scripts/launch -np 2 --map-by core --bind-to core {py} {rss_wrap} PREFIX {build}/trainer ... "
      "(the same --set flags)")
print(f"    {py} bench/torch_llama_cpu.py --config C --dtype P [--recompute] --threads T --warmup W --steps S "
      f"--max-memory {peer_cap}")
print(f"    {build}/gemm_peak --threads {cores};  {py} bench/torch_llama_cpu.py --gemm-peak --threads {cores}")
EOF
echo
cat "$OUT/table.md"
echo
echo "(table in $OUT/table.md, every run's log and metrics in $logs, results in $results)"
