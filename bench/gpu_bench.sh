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
#   ONLY="ctest_cuda ..."    run only these steps (besides the build): a rerun after a fix; it
#                            may also name the steps that run only when asked: ours_profile (our
#                            FULL_SHARD step with --profile) and sanitize (the CUDA unit tests
#                            under compute-sanitizer memcheck)
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
ONLY="${ONLY:-}"
PY="${PY:-python3}"
CONFIG=configs/llama.yaml

mkdir -p "$OUT"
logs="$(mktemp -d /tmp/gpu_bench_logs.XXXXXX)"
prefix="$root/.deps/prefix"
export root logs prefix PY BUILD_DIR  # for the steps that run as functions (bash -c under timeout)
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
  case $name in deps_unpack | cuda_libs | configure | build) ;; *)
    if [[ -n $ONLY && " $ONLY " != *" $name "* ]]; then
      note "$(printf '%-24s SKIPPED (not in ONLY)' "$name")"
      return 1
    fi
    ;;
  esac
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

note "gpu_bench $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname): commit ${COMMIT:-$(git -C "$root" log --oneline -1 2>/dev/null)}"
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
# oneDNN is not carried (the CPU side of the GPU checks uses Eigen's GEMMs);
# only the programs the steps below run are built.
built=0
[[ -f /usr/include/dnnl.hpp ]] || cmake_args+=(-DST_WITH_DNNL=OFF)
targets=(trainer prepare generate gemm_peak test_cuda_ops test_cuda_nn_ops test_nccl)
if run_step configure 150 cmake -S "$root" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DST_WERROR=OFF -DST_PYTHON="$(command -v "$PY")" "${cmake_args[@]}"; then
  grep -q "^build nccl_bench:" "$BUILD_DIR/build.ninja" 2>/dev/null && targets+=(nccl_bench)
  if [[ $SKIP_BUILD == 1 && -d $BUILD_DIR ]]; then
    skip build "SKIP_BUILD=1: using what $BUILD_DIR holds"
    built=1
  elif run_step build 330 cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}" -- -k 0; then
    built=1
  fi
fi
grep -h "shardtrain: " "$logs/configure.log" 2>/dev/null | sed 's/^-- /    /' | tee -a "$summary"

# The carried Open MPI and the CPU path, before any GPU step relies on them:
# the toy model on 2 ranks through mpirun (a few seconds).
if ((built)); then
  run_step mpi_cpu_smoke 60 mpirun --oversubscribe -np 2 "$BUILD_DIR/trainer" --config configs/toy.yaml --steps 5 \
    --set checkpoint.dir='""' --set logging.interval=5
  grep -h "INFO  done:" "$logs/mpi_cpu_smoke.log" 2>/dev/null | sed 's/^/    /' | tee -a "$summary"
fi

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

# The steps run in the order of what matters most, so that a run cut short by
# BUDGET_S still has the GEMM peak, the tests, our FULL_SHARD + BF16 +
# recomputation step and its peer, and the Hugging Face load.

# (a) the GPU's dense peak, measured: our cuBLASLt GEMM and PyTorch's matmul, large and square.
gpu_step gemm_peak 60 "$BUILD_DIR/gemm_peak" --device cuda --size 8192 --dtypes bf16,f32 --warmup 5 --repeats 20
torch_gemm_peak() {
  "$PY" - <<'PYEOF'
import json, torch
n, out = 8192, {}
for name, dtype in (("bf16", torch.bfloat16), ("f32", torch.float32)):
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.rand(n, n, device="cuda", dtype=dtype) * 2 - 1
    b = torch.rand(n, n, device="cuda", dtype=dtype) * 2 - 1
    for _ in range(5):
        a @ b
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); a @ b; end.record(); torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    out[name] = 2 * n**3 / times[len(times) // 2] / 1e9
print(json.dumps({"impl": "torch", "size": n, "gflops": out, "device": torch.cuda.get_device_name(0),
                  "torch": torch.__version__}))
PYEOF
}
export -f torch_gemm_peak
gpu_step torch_gemm_peak 60 bash -c torch_gemm_peak

# (b) every CUDA test: ops against the CPU reference, NCCL at world size 1,
# llama-tiny's losses on the GPU against the CPU (train_gpu), ranks sharing a GPU.
gpu_step ctest_cuda 240 ctest --test-dir "$BUILD_DIR" -L cuda --output-on-failure --timeout 200 -j 3
# CTest keeps a passing test's output only in LastTest.log: keep it, for the measured agreement.
cp "$BUILD_DIR/Testing/Temporary/LastTest.log" "$logs/ctest_cuda_last.log" 2>/dev/null
grep -hE "tests passed|tests failed|\*\*\*|Passed|Failed|Skipped|Not Run" "$logs/ctest_cuda.log" 2>/dev/null |
  sed 's/^/    /' | tee -a "$summary"
grep -hE "^(gpu|gpu-mpi): " "$logs/ctest_cuda_last.log" 2>/dev/null | sed 's/^/    /' | tee -a "$summary"

# (c) our trainer and the PyTorch FSDP2 peer on the same model, batch and sequence
# length: FULL_SHARD + BF16 + full recomputation first, then without recomputation.
ours() {  # ours MODE
  gpu_step "ours_$1" 120 "$BUILD_DIR/trainer" --config "$CONFIG" --steps "$STEPS" \
    --set train.global_batch_size="$MICRO_BATCH" --set train.micro_batch_size="$MICRO_BATCH" \
    --set train.seq_len="$SEQ" --set train.device=cuda --set checkpoint.dir='""' --set logging.interval=1 \
    --set fsdp.sharding_strategy=FULL_SHARD --set fsdp.mixed_precision.param_dtype=bf16 \
    --set fsdp.activation_checkpointing.mode="$1" --set logging.metrics_file="$logs/ours_$1.jsonl"
}
peer() {  # peer eager|compile none|full
  local flags=()
  [[ $1 == compile ]] && flags+=(--compile)
  [[ $2 == full ]] && flags+=(--recompute)
  gpu_step "torch_${1}_$2" "$([[ $1 == compile ]] && echo 150 || echo 90)" "$PY" bench/torch_fsdp2.py \
    --config "$CONFIG" --set train.micro_batch_size="$MICRO_BATCH" --set train.global_batch_size="$MICRO_BATCH" \
    --set train.seq_len="$SEQ" --steps "$TORCH_STEPS" --warmup 5 "${flags[@]}" --json "$logs/torch_${1}_$2.json"
}
ours full
peer eager full

# Only when named in ONLY: where our step's time goes, and memcheck over the CUDA unit tests.
if [[ " $ONLY " == *" ours_profile "* ]]; then
  gpu_step ours_profile 120 "$BUILD_DIR/trainer" --config "$CONFIG" --steps 12 --profile \
    --set train.global_batch_size="$MICRO_BATCH" --set train.micro_batch_size="$MICRO_BATCH" \
    --set train.seq_len="$SEQ" --set train.device=cuda --set checkpoint.dir='""' --set logging.interval=4 \
    --set fsdp.activation_checkpointing.mode=full
fi
if [[ " $ONLY " == *" sanitize "* ]]; then
  sanitize() {
    local t rc=0
    for t in test_cuda_ops test_cuda_nn_ops; do
      "$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)" --tool memcheck \
        --error-exitcode 9 "$BUILD_DIR/tests/unit/$t" || rc=1
    done
    return $rc
  }
  export -f sanitize
  gpu_step sanitize 150 bash -c sanitize
  grep -hE "ERROR SUMMARY|^\[  (PASSED|FAILED) " "$logs/sanitize.log" 2>/dev/null | sed 's/^/    /' | tee -a "$summary"
fi

# (d) a real Hugging Face load: prepare (a SentencePiece tokenizer trained on this
# repository's documentation), a small llama trained on the GPU in F32, its
# unified checkpoint loaded by transformers and compared with our forward.
hf_train() {
  local work=/tmp/gpu_bench_hf device=cuda
  rm -rf "$work" && mkdir -p "$work/text"
  find "$root" -path "$root/.deps" -prune -o -path "$root/build*" -prune -o \( -name '*.md' -o -name '*.h' \) \
    -type f -print0 | xargs -0 cat >"$work/text/repo.txt"
  "$BUILD_DIR/prepare" "$work/text" --out "$work/data" --train-tokenizer --vocab-size 1024 || return 1
  local sets=(--set model.vocab_size=1024 --set data.path="$work/data/train" --set data.val_path="$work/data/val"
    --set data.tokenizer="$work/data/tokenizer.model" --set fsdp.mixed_precision.param_dtype=f32
    --set checkpoint.dir="$work/ckpt" --set checkpoint.interval=0 --set logging.metrics_file='""'
    --set logging.plot=false --set eval.sample_tokens=0 --set eval.batches=1 --set logging.interval=50)
  "$BUILD_DIR/trainer" --config configs/tutorial.yaml --steps 300 --set train.device=$device "${sets[@]}" || {
    echo "hf_train: the GPU run failed; training on the CPU instead so that the load is still checked"
    rm -rf "$work/ckpt"
    "$BUILD_DIR/trainer" --config configs/tutorial.yaml --steps 300 --set train.device=cpu "${sets[@]}" || return 1
  }
  "$PY" bench/hf_check.py "$work/ckpt/$(cat "$work/ckpt/latest")" --generate "$BUILD_DIR/generate" \
    --json "$logs/hf_check.json"
}
export -f hf_train
gpu_step hf_load 150 bash -c hf_train
grep -h "^hf_check: \|^hf_train: " "$logs/hf_load.log" 2>/dev/null | cut -c1-400 | sed 's/^/    /' | tee -a "$summary"

ours none
peer eager none

# (e) collective bandwidth at world size 1 (NCCL's local path), when built.
if [[ -x $BUILD_DIR/nccl_bench ]]; then
  gpu_step nccl_bench 60 mpirun -np 1 "$BUILD_DIR/nccl_bench" --max-bytes 268435456
else
  skip nccl_bench "${reason:-$BUILD_DIR/nccl_bench was not built}"
fi

# (f) the compiled peer last: torch.compile takes a minute or more per run.
peer compile full
peer compile none

# --- 5. the table -----------------------------------------------------------------------------
table() {
  "$PY" - "$logs" "$MICRO_BATCH" "$SEQ" "$CONFIG" <<'EOF'
import json, os, statistics, subprocess, sys

logs, micro, seq, config = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def json_lines(name):
    path = os.path.join(logs, name)
    if not os.path.exists(path):
        return []
    rows = []
    for line in open(path):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows

# The measured dense BF16 peak: the faster of our cuBLASLt GEMM and PyTorch's matmul at 8192^3.
peaks = {}
for row in json_lines("gemm_peak.log"):
    peaks[f"ours {row['dtype']}"] = row["gflops"] * 1e9
for row in json_lines("torch_gemm_peak.log"):
    for dtype, gflops in row["gflops"].items():
        peaks[f"torch {dtype}"] = gflops * 1e9
if peaks:
    print("GEMM 8192^3 (median of 20): " + ", ".join(f"{k} {v / 1e12:.1f} TFLOP/s" for k, v in sorted(peaks.items())))
peak = max([v for k, v in peaks.items() if k.endswith("bf16")], default=0.0)

try:
    count = json.loads(subprocess.run([os.environ.get("PY", "python3"), "bench/torch_fsdp2.py", "--count-only",
                                       "--config", config, "--set", f"train.seq_len={seq}"],
                                      capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    flops_per_token = count["flops_per_token"]
except Exception as e:  # noqa: BLE001
    print(f"(no FLOP count: {e})")
    flops_per_token = 0.0

def ours(mode):
    rows = [r for r in json_lines(f"ours_{mode}.jsonl") if "event" not in r]  # step lines, not the start line
    steady = rows[5:] or rows  # the first steps warm up (allocator, cuBLAS heuristics)
    if not steady:
        return None
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
            "peak": max(r.get("peak_bytes", 0) for r in rows), "steps": len(steady),
            "loss": f"{rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}"}

def peer(mode, recompute):
    rows = json_lines(f"torch_{mode}_{recompute}.json")
    if not rows:
        return None
    r = rows[-1]
    return {"tokens_per_s": r["tokens_per_s"], "peak": r["peak_memory_bytes"], "steps": r["timed_steps"],
            "loss": f"{r['first_loss']:.3f} -> {r['last_loss']:.3f}"}

def mfu(r):
    if r is None or not peak or not flops_per_token:
        return "-"
    return f"{100 * r['tokens_per_s'] * flops_per_token / peak:.1f}%"

print(f"\n{config}, 1 GPU, FULL_SHARD + BF16, micro-batch {micro} x seq {seq} = {micro * seq:,} tokens/step; "
      f"{flops_per_token / 1e9:.2f} GFLOP/token")
print(f"{'run':<28}{'tokens/s':>11}{'MFU':>8}{'peak mem':>11}{'ours/this':>11}  loss")
for recompute in ("full", "none"):
    o = ours(recompute)
    rows = [(f"ours recompute={recompute}", o)]
    rows += [(f"torch {m} recompute={recompute}", peer(m, recompute)) for m in ("eager", "compile")]
    for name, r in rows:
        ratio = "-"
        if r is not None and o is not None and r is not o and r["tokens_per_s"] > 0:
            ratio = f"{o['tokens_per_s'] / r['tokens_per_s']:.2f}x"
        tps = f"{r['tokens_per_s']:,.0f}" if r else "-"
        mem = f"{r['peak'] / 2**30:.1f} GiB" if r else "-"
        print(f"{name:<28}{tps:>11}{mfu(r):>8}{mem:>11}{ratio:>11}  {r['loss'] if r else ''}")
print("ours: median tokens/s over the steps after the 5th; torch: mean of its timed steps after 5 warm-up steps.")
print(f"MFU: tokens/s x FLOP/token (6 x matmul params + attention, metrics/flops.h) / the measured BF16 peak "
      f"({peak / 1e12:.1f} TFLOP/s).")
print("peak memory: ours = our caching allocator's peak bytes, torch = torch.cuda.max_memory_allocated.")
EOF
}
table | tee -a "$summary"
note "total $(($(date +%s) - t_begin)) s; logs in $OUT/logs.tar.gz"
pack
