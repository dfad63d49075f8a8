#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite; this is
# what CI runs (.ci/run). Without arguments, five stages, each failing the
# script on any failure or finding:
#   1. build/ and the whole CTest suite (unit tests, multi-rank tests at 1-4
#      ranks, trainer runs end to end), at the machine's own instruction set;
#   1b. the same build at the AVX2 cap (ST_MAX_CPU_ISA=avx2, core/cpu/isa.h):
#      the unit tests, the PyTorch reference of the model, short FSDP + BF16
#      training checks and the memory check, so that a machine with AVX-512
#      or AMX also tests the paths of an AVX2-only CPU (skipped on a CPU
#      without AVX-512, whose own level is that cap: stage 1 ran them there);
#   2. fuzzing: scripts/fuzz.sh, every libFuzzer target of fuzz/ for
#      FUZZ_SECONDS (default 30) on its seed corpus, clang + ASan + UBSan;
#   3. ASan + UBSan: scripts/sanitize.sh address, every unit test and the
#      tests labelled asan, built with g++ in build-asan/;
#   4. TSan: scripts/sanitize.sh thread, the tests labelled tsan (those of the
#      threads), built in build-tsan/.
# Arguments go to ctest, and then only stage 1 runs, e.g.
#   scripts/test.sh -R comm        # only the collective tests
#   scripts/test.sh -L unit        # one label: unit, mpi, e2e, reference, repo
#                                  # (tests/README.md), or cuda, cluster, asan, tsan
#   scripts/test.sh -L mpi         # only multi-rank tests
#
# Environment:
#   FUZZ_SECONDS=N          seconds per fuzz target (default 30; 0 skips stage 2)
#   ST_SANITIZE_STAGES=...  which sanitizer stages run: "address thread"
#                           (default), "address", "thread", or 0 for none
#   ST_ISA_STAGE=0          skips stage 1b
#   ST_BUILD_DIR, ST_JOBS   as for scripts/setup.sh
# Each stage prints how long it took ("test: stage ... took N s").
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${ST_BUILD_DIR:-$root/build}"
fuzz_seconds="${FUZZ_SECONDS:-30}"
sanitize_stages="${ST_SANITIZE_STAGES:-address thread}"

[[ $fuzz_seconds =~ ^[0-9]+$ ]] || { echo "test: FUZZ_SECONDS must be a number of seconds (0 skips), got '$fuzz_seconds'" >&2; exit 2; }
[[ $sanitize_stages =~ ^(0|address|thread|address\ thread|thread\ address)$ ]] || {
  echo "test: ST_SANITIZE_STAGES must be 'address thread', 'address', 'thread' or 0, got '$sanitize_stages'" >&2
  exit 2
}

# stage NAME COMMAND...: runs the command and says how long it took.
stage() {
  local name=$1 start=$SECONDS
  shift
  echo "test: stage $name"
  "$@"
  echo "test: stage $name took $((SECONDS - start)) s"
}

run_ctest() {
  "$root/scripts/setup.sh"
  cd "$build_dir"
  ctest --output-on-failure -j "${ST_JOBS:-$(nproc)}" "$@"
}

if (($#)); then
  run_ctest "$@"
  exit 0
fi
stage "build + ctest" run_ctest
if [[ ${ST_ISA_STAGE:-1} != 0 ]] && ! grep -qw avx512f /proc/cpuinfo; then
  echo "test: stage ctest at the AVX2 cap skipped: this CPU has no AVX-512, so stage 1 ran at AVX2"
elif [[ ${ST_ISA_STAGE:-1} != 0 ]]; then
  stage "ctest at the AVX2 cap" env ST_MAX_CPU_ISA=avx2 \
    ctest --test-dir "$build_dir" --output-on-failure -j "${ST_JOBS:-$(nproc)}" \
    -R '^(test_.*|torch_reference_llama|train_fsdp-default|train_dp|fault_memory|isa_.*)$' -L 'unit|reference|e2e'
fi
if ((fuzz_seconds > 0)); then
  stage "fuzz (${fuzz_seconds} s per target)" env FUZZ_SECONDS="$fuzz_seconds" "$root/scripts/fuzz.sh"
fi
if [[ $sanitize_stages != 0 ]]; then
  for mode in address thread; do
    [[ " $sanitize_stages " == *" $mode "* ]] || continue
    stage "sanitize $mode" "$root/scripts/sanitize.sh" "$mode"
  done
fi
