#!/usr/bin/env bash
# The one script a GPU session runs: builds shardtrain on the lent machine,
# runs the CUDA tests, trains configs/llama.yaml on one GPU with our trainer
# and with the PyTorch FSDP2 peer (bench/torch_fsdp2.py) on the same model,
# batch and sequence length, and writes a comparison table.
#
#   scripts/fetch_gpu_deps.sh                 # once, where Debian's archive is reachable
#   bash bench/gpu_bench.sh                   # on the GPU machine, with .deps carried
#   OUT=/tmp/gb bash bench/gpu_bench.sh       # anywhere: GPU steps are reported as skipped
#
# Everything it learns goes under $OUT (default bench/out/gpu): summary.txt
# (every step with its status and seconds, then the table) and logs.tar.gz
# (each step's log and the raw metrics). Logs are bundled rather than left
# loose because the device machine returns at most 8 files; both files are
# rewritten after every step, so a run cut short still returns what it did.
# Steps continue past failures; each is capped with `timeout`, and the whole
# run with BUDGET_S (default 540 s: a device command may run 10 minutes).
#
# Settings (environment):
#   MICRO_BATCH=4 SEQ=2048   sequences per step (one micro-batch, one GPU) and tokens per sequence;
#                            1.1B params need ~18 GB of FP32 state; activations at 4 x 2048 without
#                            recomputation are what decides whether 80 GB suffice (see the logs' peaks)
#   STEPS=30 TORCH_STEPS=20  trainer steps (the first 5 are not counted) / peer timed steps (after 5 warm-up)
#   BUILD_DIR=build          SKIP_BUILD=1 reuses an existing build (configure still runs)
#   BUDGET_S=540 JOBS=nproc  PY=python3 (the Python with torch)
set -uo pipefail  # no -e: a failed step is recorded and the next one runs

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
OUT="${OUT:-$root/bench/out/gpu}"
BUILD_DIR="${BUILD_DIR:-$root/build}"
MICRO_BATCH="${MICRO_BATCH:-4}"
SEQ="${SEQ:-2048}"
STEPS="${STEPS:-30}"
TORCH_STEPS="${TORCH_STEPS:-20}"
BUDGET_S="${BUDGET_S:-540}"
JOBS="${JOBS:-$(nproc)}"
SKIP_BUILD="${SKIP_BUILD:-0}"
PY="${PY:-python3}"
CONFIG=configs/llama.yaml

mkdir -p "$OUT"
logs="$(mktemp -d /tmp/gpu_bench_logs.XXXXXX)"
prefix="$root/.deps/prefix"
export root logs prefix PY  # for the steps that run as functions (bash -c under timeout)
summary="$OUT/summary.txt"
t_begin=$(date +%s)
: >"$summary"

note() { echo "$*" | tee -a "$summary"; }
pack() { tar -C "$logs" -czf "$OUT/logs.tar.gz" . 2>/dev/null; }

# run_step NAME CAP_SECONDS COMMAND...: runs with its log in $logs/NAME.log,
# capped by CAP and by what is left of BUDGET_S; records ok / FAILED / TIMEOUT.
run_step() {
  local name=$1 cap=$2
  shift 2
  local left=$((BUDGET_S - ($(date +%s) - t_begin) - 15))  # 15 s kept for the table
  if ((left < 20)); then
    note "$(printf '%-24s SKIPPED (time budget of %s s spent)' "$name" "$BUDGET_S")"
    return 1
  fi
  ((cap > left)) && cap=$left
  echo "== $name (cap ${cap}s): $*"
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=10 "$cap" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  local secs=$(($(date +%s) - t0)) status=ok
  if ((rc == 124 || rc == 137)); then
    status="TIMEOUT after ${cap}s"
  elif ((rc != 0)); then
    status="FAILED (exit $rc)"
  fi
  note "$(printf '%-24s %-22s %5ss  %s' "$name" "$status" "$secs" "log: $name.log")"
  ((rc != 0)) && tail -n 15 "$logs/$name.log" | sed 's/^/    | /'
  pack
  return "$rc"
}
skip() { note "$(printf '%-24s SKIPPED (%s)' "$1" "$2")"; }

note "gpu_bench $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname): $(git -C "$root" log --oneline -1 2>/dev/null)"
note "settings: micro_batch $MICRO_BATCH, seq $SEQ, trainer steps $STEPS, peer timed steps $TORCH_STEPS, budget ${BUDGET_S}s, build $BUILD_DIR"

# --- 1. dependencies: unpack the carried .debs (scripts/fetch_gpu_deps.sh) ------------------
cmake_args=()
unpack_debs() {
  local stamp="$prefix/.unpacked" list
  list="$(ls "$root"/.deps/debs/*.deb)"
  if [[ -f $stamp && "$(cat "$stamp")" == "$list" ]]; then
    echo "already unpacked"
  else
    rm -rf "$prefix" && mkdir -p "$prefix"
    for deb in $list; do dpkg -x "$deb" "$prefix" || return 1; done
    echo "$list" >"$stamp"
  fi
  # dpkg -x runs no maintainer scripts, so the alternatives links are missing.
  local bin="$prefix/usr/bin"
  for tool in mpirun mpiexec mpicxx mpicc; do ln -sf "$tool.openmpi" "$bin/$tool"; done
  ls "$bin"/mpicxx "$prefix/usr/include/yaml-cpp/yaml.h" "$prefix/usr/include/eigen3/Eigen/Core" \
    "$prefix/usr/include/nlohmann/json.hpp" "$prefix/usr/include/gtest/gtest.h"
}
export -f unpack_debs
if compgen -G "$root/.deps/debs/*.deb" >/dev/null; then
  if run_step deps_unpack 60 bash -c unpack_debs; then
    P="$prefix/usr"
    arch_lib="$P/lib/x86_64-linux-gnu"
    export PATH="$P/bin:$PATH"
    export LD_LIBRARY_PATH="$arch_lib:$arch_lib/openmpi/lib:$arch_lib/pmix2/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export OPAL_PREFIX="$P"                                  # Open MPI finds its plugins, help files, orted here
    export PMIX_MCA_pcompress_base_silence_warning=1         # PMIx's help files stay at their build path
    export OMPI_MCA_plm_rsh_agent=false                      # no ssh there; every rank is local
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # device commands run as root
    export CMAKE_PREFIX_PATH="$P${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    cmake_args+=(-DMPI_CXX_COMPILER="$P/bin/mpicxx.openmpi" -DMPIEXEC_EXECUTABLE="$P/bin/mpirun.openmpi")
  fi
else
  skip deps_unpack "no .deps/debs: using the system's packages (scripts/fetch_gpu_deps.sh fetches them)"
fi

# --- 2. NCCL and cuBLAS from the Python wheels when the toolkit lacks them ---------------------
find_cuda_libs() {
  local nvidia_dirs
  nvidia_dirs="$("$PY" -c 'import nvidia, sys; print(" ".join(nvidia.__path__))' 2>/dev/null)"
  echo "python: $(command -v "$PY"); nvidia wheel folders: ${nvidia_dirs:-none}"
  local nccl_root
  nccl_root="$("$PY" -c 'import nvidia.nccl as m, os; print(list(m.__path__)[0])' 2>/dev/null)"
  if [[ -n $nccl_root && -f $nccl_root/include/nccl.h ]]; then
    echo "NCCL: $nccl_root"
    echo "-DST_NCCL_ROOT=$nccl_root" >>"$logs/cmake_args"
    echo "$nccl_root/lib" >>"$logs/lib_dirs"
  else
    echo "NCCL: no nvidia.nccl wheel with include/nccl.h; the build looks in the toolkit"
  fi
  local cuda_lib=/usr/local/cuda/lib64
  if [[ -e $cuda_lib/libcublas.so && -e $cuda_lib/libcublasLt.so && -f /usr/local/cuda/include/cublas_v2.h ]]; then
    echo "cuBLAS: in the toolkit ($cuda_lib)"
    return 0
  fi
  local cublas="" cublaslt="" header=""
  for d in $nvidia_dirs; do
    [[ -z $cublas ]] && cublas="$(find "$d" -name 'libcublas.so*' 2>/dev/null | sort | head -1)"
    [[ -z $cublaslt ]] && cublaslt="$(find "$d" -name 'libcublasLt.so*' 2>/dev/null | sort | head -1)"
    [[ -z $header ]] && header="$(find "$d" -name cublas_v2.h 2>/dev/null | head -1)"
  done
  if [[ -z $cublas || -z $cublaslt || -z $header ]]; then
    echo "cuBLAS: not in the toolkit nor in the wheels (lib '$cublas', Lt '$cublaslt', header '$header')"
    return 1
  fi
  echo "cuBLAS: $cublas, $cublaslt, headers $(dirname "$header")"
  {
    echo "-DCUDA_cublas_LIBRARY=$cublas"
    echo "-DCUDA_cublasLt_LIBRARY=$cublaslt"
    echo "-DCMAKE_CXX_FLAGS=-isystem $(dirname "$header")"
    echo "-DCMAKE_CUDA_FLAGS=-isystem $(dirname "$header")"
  } >>"$logs/cmake_args"
  dirname "$cublas" >>"$logs/lib_dirs"
}
export -f find_cuda_libs
rm -f "$logs/cmake_args" "$logs/lib_dirs"
run_step cuda_libs 60 bash -c find_cuda_libs
if [[ -f $logs/cmake_args ]]; then mapfile -t extra <"$logs/cmake_args" && cmake_args+=("${extra[@]}"); fi
if [[ -f $logs/lib_dirs ]]; then
  while read -r d; do export LD_LIBRARY_PATH="$d:$LD_LIBRARY_PATH"; done <"$logs/lib_dirs"
fi

# --- 3. configure and build ------------------------------------------------------------------
# Warnings are not errors here: CI enforces them; a newer compiler's new
# warning must not cost the GPU session its benchmark.
built=0
if run_step configure 150 cmake -S "$root" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DST_WERROR=OFF -DST_PYTHON="$(command -v "$PY")" "${cmake_args[@]}"; then
  if [[ $SKIP_BUILD == 1 && -d $BUILD_DIR ]]; then
    skip build "SKIP_BUILD=1: using what $BUILD_DIR holds"
    built=1
  elif run_step build 330 cmake --build "$BUILD_DIR" -j "$JOBS"; then
    built=1
  fi
fi
grep -h "shardtrain: " "$logs/configure.log" 2>/dev/null | sed 's/^-- /    /' | tee -a "$summary"

# --- 4. the GPU steps ----------------------------------------------------------------------------
gpu=""
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
fi
if [[ -z $gpu ]]; then
  reason="no GPU visible (nvidia-smi -L found none)"
elif ((!built)); then
  reason="the build failed"
else
  reason=""
  note "GPU: $gpu"
fi

gpu_step() {  # gpu_step NAME CAP COMMAND...: skipped, clearly, when the GPU or the build is missing
  if [[ -n $reason ]]; then
    skip "$1" "$reason"
    return 1
  fi
  run_step "$@"
}

# (a) every CUDA test (ops against the CPU reference, NCCL, the GPU training checks).
gpu_step ctest_cuda 150 ctest --test-dir "$BUILD_DIR" -L cuda --output-on-failure --timeout 120

# (b) our trainer, one GPU, recomputation off and full.
for mode in none full; do
  gpu_step "ours_$mode" 110 "$BUILD_DIR/trainer" --config "$CONFIG" --steps "$STEPS" \
    --set train.global_batch_size="$MICRO_BATCH" --set train.micro_batch_size="$MICRO_BATCH" \
    --set train.seq_len="$SEQ" --set train.device=cuda --set checkpoint.dir='""' --set logging.interval=1 \
    --set fsdp.activation_checkpointing.mode="$mode" --set logging.metrics_file="$logs/ours_$mode.jsonl"
done

# (c) the PyTorch FSDP2 peer on the same model, batch and sequence length.
for mode in eager compile; do
  for recompute in none full; do
    flags=()
    [[ $mode == compile ]] && flags+=(--compile)
    [[ $recompute == full ]] && flags+=(--recompute)
    cap=90
    [[ $mode == compile ]] && cap=150
    gpu_step "torch_${mode}_$recompute" "$cap" "$PY" bench/torch_fsdp2.py --config "$CONFIG" \
      --set train.micro_batch_size="$MICRO_BATCH" --set train.global_batch_size="$MICRO_BATCH" \
      --set train.seq_len="$SEQ" --steps "$TORCH_STEPS" --warmup 5 "${flags[@]}" \
      --json "$logs/torch_${mode}_$recompute.json"
  done
done

# (d) collective bandwidth at world size 1 (NCCL's local path), when built.
if [[ -x $BUILD_DIR/nccl_bench ]]; then
  gpu_step nccl_bench 60 mpirun -np 1 "$BUILD_DIR/nccl_bench" --max-bytes 268435456
else
  skip nccl_bench "${reason:-$BUILD_DIR/nccl_bench was not built}"
fi

# --- 5. the table -----------------------------------------------------------------------------
table() {
  "$PY" - "$logs" "$MICRO_BATCH" "$SEQ" <<'EOF'
import json, os, statistics, sys

logs, micro, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def ours(mode):
    path = os.path.join(logs, f"ours_{mode}.jsonl")
    if not os.path.exists(path):
        return None
    rows = [json.loads(l) for l in open(path) if l.strip()]
    steady = rows[5:] or rows  # the first steps warm up (allocator, cuBLAS heuristics)
    if not steady:
        return None
    mfus = [r["mfu"] for r in steady if "mfu" in r]
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
            "mfu": statistics.median(mfus) if mfus else None,
            "peak": max(r.get("peak_bytes", 0) for r in rows), "steps": len(steady)}

def peer(mode, recompute):
    path = os.path.join(logs, f"torch_{mode}_{recompute}.json")
    if not os.path.exists(path):
        return None
    r = json.loads(open(path).read())
    return {"tokens_per_s": r["tokens_per_s"], "mfu": r["mfu"] if r.get("peak_flops") else None,
            "peak": r["peak_memory_bytes"], "steps": r["timed_steps"]}

def cell(r, key):
    if r is None:
        return "-"
    v = r[key]
    if v is None:
        return "n/a"
    return {"tokens_per_s": f"{v:,.0f}", "mfu": f"{100 * v:.1f}%", "peak": f"{v / 2**30:.1f} GiB"}[key]

print(f"\nconfigs/llama.yaml, 1 GPU, micro-batch {micro} x seq {seq} = {micro * seq:,} tokens/step")
print(f"{'run':<28}{'tokens/s':>12}{'MFU':>9}{'peak mem':>12}{'ours / this':>13}")
for recompute in ("none", "full"):
    o = ours(recompute)
    rows = [(f"ours recompute={recompute}", o)]
    rows += [(f"torch {m} recompute={recompute}", peer(m, recompute)) for m in ("eager", "compile")]
    for name, r in rows:
        ratio = "-"
        if r is not None and o is not None and r is not o and r["tokens_per_s"] > 0:
            ratio = f"{o['tokens_per_s'] / r['tokens_per_s']:.2f}x"
        print(f"{name:<28}{cell(r, 'tokens_per_s'):>12}{cell(r, 'mfu'):>9}{cell(r, 'peak'):>12}{ratio:>13}")
print("ours: median over steps after the 5th (tokens/s, MFU) and the largest peak; torch: mean of the timed steps.")
print("MFU counts 6 x matmul params + 12 x L x T x D FLOPs per token (launch/flops.h), against the BF16 dense peak.")
print("peak memory: ours = our caching allocator's peak bytes, torch = torch.cuda.max_memory_allocated.")
EOF
}
table | tee -a "$summary"
note "total $(($(date +%s) - t_begin)) s; logs in $OUT/logs.tar.gz"
pack
