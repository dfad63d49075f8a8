#!/usr/bin/env bash
# Builds the project and its tests with AddressSanitizer + UndefinedBehaviorSanitizer
# (g++, ST_SANITIZE=address,undefined) into build-asan/ and runs the unit tests
# (ctest -L unit). Arguments replace "-L unit" as ctest's selection, e.g.
#   scripts/sanitize.sh                      # every unit test
#   scripts/sanitize.sh -R test_commit       # one test
# A sanitizer report (memory error, leak, undefined behaviour) aborts the test
# binary, so its test fails. Leak reports from third-party libraries are
# suppressed by scripts/sanitize.supp, one commented entry per library; our own
# code gets none.
#
# Environment: ST_ASAN_BUILD_DIR (default build-asan), ST_JOBS (default: all cores).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${ST_ASAN_BUILD_DIR:-$root/build-asan}"
jobs="${ST_JOBS:-$(nproc)}"

# No ST_WERROR: GCC warns differently with sanitizers on (false
# maybe-uninitialized); the normal build holds the warnings to zero.
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DST_SANITIZE=address,undefined -DST_WITH_CUDA=OFF >/dev/null
cmake --build "$build_dir" -j "$jobs"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$root/scripts/sanitize.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
(($#)) || set -- -L unit
cd "$build_dir"
ctest --output-on-failure -j "$jobs" "$@"
