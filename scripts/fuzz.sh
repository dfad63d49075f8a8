#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan) into their own
# build directory and runs each for a fixed time on a copy of its seed corpus
# (fuzz/corpus/<target>/, left unchanged). Fails, naming the target and the
# saved input, on any crash, leak, timeout, out-of-memory or sanitizer report.
#
#   scripts/fuzz.sh                        # every target, 30 s each
#   FUZZ_SECONDS=600 scripts/fuzz.sh index # one target, 10 minutes
#
# Environment: FUZZ_SECONDS (default 30), ST_FUZZ_BUILD_DIR (default
# build-fuzz), ST_JOBS (build jobs, default: all cores), CXX (default clang++).
# A failing input is kept as <build>/fuzz-run/<target>/artifacts/crash-* (or
# leak-, timeout-, oom-); rerun it with <build>/fuzz/fuzz_<target> FILE.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${ST_FUZZ_BUILD_DIR:-$root/build-fuzz}"
seconds="${FUZZ_SECONDS:-30}"
jobs="${ST_JOBS:-$(nproc)}"
cxx="${CXX:-clang++}"
all_targets=(safetensors index trainer_state commit config token_shard metrics)
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")

[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: FUZZ_SECONDS must be a positive integer, got '$seconds'" >&2; exit 2; }
for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz: unknown target '$t' (targets: ${all_targets[*]})" >&2; exit 2; }
done
command -v "$cxx" >/dev/null || {
  echo "fuzz: needs clang with libFuzzer: apt-get install clang libclang-rt-14-dev (or set CXX)" >&2
  exit 2
}

cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DST_FUZZ=ON -DST_BUILD_TESTS=OFF -DST_WITH_CUDA=OFF -DST_WITH_DNNL=OFF >/dev/null
cmake --build "$build_dir" -j "$jobs" --target "${targets[@]/#/fuzz_}"

# Leaks are findings (ASan's leak check runs after every input); UB aborts.
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"

failed=()
report=()
for t in "${targets[@]}"; do
  run="$build_dir/fuzz-run/$t"
  rm -rf "$run"
  mkdir -p "$run/corpus" "$run/artifacts" "$run/tmp"
  cp "$root/fuzz/corpus/$t/"* "$run/corpus/"
  before=$(find "$run/corpus" -type f | wc -l)
  echo "fuzz: $t for ${seconds} s (log: $run/log)"
  start=$(date +%s)
  rc=0
  # -malloc_limit_mb reports one oversized allocation with its stack (the RSS
  # limit alone names no culprit). libFuzzer has been seen to hang in its exit
  # path after an out-of-memory report, so a hard limit ends the run regardless.
  TMPDIR="$run/tmp" timeout -s KILL $((seconds + 300)) "$build_dir/fuzz/fuzz_$t" -max_total_time="$seconds" \
    -timeout=25 -rss_limit_mb=2048 -malloc_limit_mb=256 -print_final_stats=1 -artifact_prefix="$run/artifacts/" \
    "$run/corpus" >"$run/log" 2>&1 || rc=$?
  elapsed=$(($(date +%s) - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$run/log" | tail -1)
  new=$(($(find "$run/corpus" -type f | wc -l) - before))
  artifacts=$(find "$run/artifacts" -type f | sort)
  if ((rc != 0)) || [[ -n $artifacts ]]; then
    result="FAIL (rc $rc) ${artifacts:-no input saved; see the log}"
    failed+=("$t")
    echo "fuzz: $t FAILED; the end of its log:" >&2
    tail -n 40 "$run/log" >&2
  else
    result=ok
  fi
  report+=("$(printf '%-14s %6s s %12s execs %6s new  %s' "$t" "$elapsed" "${execs:-?}" "$new" "$result")")
done

echo "fuzz: results (${seconds} s per target; ASan + UBSan + leak checks)"
printf '  %s\n' "${report[@]}"
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
