#!/usr/bin/env bash
# Builds the project and its tests with g++ and a sanitizer, and runs a
# selection of the CTest suite under it. Two modes (the first argument):
#
#   address  (default) AddressSanitizer + leak checks + UndefinedBehaviorSanitizer
#            (ST_SANITIZE=address,undefined), built with clang in build-asan/: every unit test and
#            the tests labelled `asan` (multi-rank tests at 3-4 ranks, a
#            trainer run saving in the background, stopped and resumed, the
#            ckpt tool, prepare, the trainer's command-line errors, the
#            single-process reference comparisons, readme_config_keys),
#            i.e. ctest -L 'unit|asan'.
#   thread   ThreadSanitizer (ST_SANITIZE=thread) in build-tsan/: the tests
#            labelled `tsan`, those of shardtrain's threads (OpenMP's pool of the
#            CPU ops and GEMMs, the checkpoint I/O threads, the async save, the
#            watchdog, prepare's encoders); it builds only the binaries they run
#            (the target tsan_selection).
#
#   scripts/sanitize.sh                        # ASan + UBSan selection
#   scripts/sanitize.sh thread                 # TSan selection
#   scripts/sanitize.sh address -R test_commit # other ctest arguments replace the selection
#
# The asan and tsan labels live beside the tests, at the end of each
# tests/*/CMakeLists.txt; the TSan target list at the end of tests/CMakeLists.txt. A sanitizer report (memory error, leak, undefined
# behaviour, data race) ends the process, so its test fails, and is written
# to <build>/sanitizer-reports/, so that it fails the script too when it came
# from a process whose test expects it to fail (a bad input, a killed job);
# the script prints every report at the end. Reports from
# third-party libraries are suppressed by scripts/sanitize.supp (leaks, for
# ASan) and scripts/tsan.supp (races), one commented entry per library; our
# own code gets none.
#
# Environment: ST_ASAN_BUILD_DIR (default build-asan), ST_TSAN_BUILD_DIR
# (default build-tsan), ST_ASAN_CXX (default clang++), ST_TSAN_CXX (default
# g++), ST_JOBS (default: all cores), and ASAN_OPTIONS,
# LSAN_OPTIONS, UBSAN_OPTIONS, TSAN_OPTIONS, which are added to ours.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${ST_JOBS:-$(nproc)}"
mode=address
if (($#)) && [[ $1 == address || $1 == thread ]]; then
  mode=$1
  shift
fi

if [[ $mode == address ]]; then
  build_dir="${ST_ASAN_BUILD_DIR:-$root/build-asan}"
  reports="$build_dir/sanitizer-reports"
  sanitize=address,undefined
  cxx="${ST_ASAN_CXX:-clang++}"
  targets=(all)
  selection=(-L 'unit|asan')
  # detect_leaks: leak checks at exit, third-party ones suppressed by
  # sanitize.supp. abort_on_error: a report ends in SIGABRT.
  # strict_string_checks: str* functions check the whole string they read.
  export ASAN_OPTIONS="log_path=$reports/asan:detect_leaks=1:abort_on_error=1:strict_string_checks=1:${ASAN_OPTIONS:-}"
  # Open MPI keeps its plugins (mca_*.so) loaded until exit, so that the
  # frames of the allocations they leak still have a library name at exit.
  export OMPI_MCA_mca_base_component_disable_dlclose=1
  export LSAN_OPTIONS="suppressions=$root/scripts/sanitize.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
  export UBSAN_OPTIONS="log_path=$reports/ubsan:print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
else
  build_dir="${ST_TSAN_BUILD_DIR:-$root/build-tsan}"
  reports="$build_dir/sanitizer-reports"
  sanitize=thread
  cxx="${ST_TSAN_CXX:-g++}"
  targets=(tsan_selection)
  selection=(-L tsan)
  # halt_on_error: the first race ends the process with exit code 66 (not
  # abort_on_error: a rank that raised SIGABRT under TSan hung in Open MPI's
  # signal handler until the test's 300 s timeout). second_deadlock_stack:
  # lock-order reports show both stacks.
  export TSAN_OPTIONS="log_path=$reports/tsan:halt_on_error=1:second_deadlock_stack=1:suppressions=$root/scripts/tsan.supp:${TSAN_OPTIONS:-}"
fi

# -O1 -g1 (line tables): the sanitizers' advice, and on the 2-core CI machine
# a compile 2.6 times faster than RelWithDebInfo's -O2 -g (launch/config.cpp
# under ASan: 6.2 s of CPU against 16.3). ASan builds with clang, which
# compiles under ASan about twice as fast as g++ (the same file: 2.7 s) and
# is the compiler of the fuzz stage; TSan stays with g++ and its libgomp.
# No ST_WERROR: compilers warn differently with sanitizers on (GCC's false
# maybe-uninitialized); the normal build holds the warnings to zero.
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DST_SANITIZE="$sanitize" -DST_WITH_CUDA=OFF >/dev/null
cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}"

(($#)) || set -- "${selection[@]}"
rm -rf "$reports"
mkdir -p "$reports"
cd "$build_dir"
# Two passes. Tests that start MPI processes (labels mpi, e2e, reference; the
# reference tests that train first start mpirun) run with
# fast_unwind_on_malloc=0: every allocation's stack is unwound with DWARF,
# because Debian's Open MPI has no frame pointers and the fast unwinder stops
# in its first frame, so no suppression could name the library MPI_Init leaks
# from. That costs little there (a 4-rank trainer_selfcheck: 16 s instead of 9)
# but 3 to 12 times the time in the allocation-heavy unit tests
# (test_tokenizer 45 s instead of 3.6), which need no suppression and keep
# the fast unwinder. The single-process reference comparisons in the default
# selection (torch_reference_llama, torch_reference_optim, safetensors_python,
# flops_peer_python) run small programs and take the second pass with their
# label. ThreadSanitizer has one pass.
rc=0
if [[ $mode == address ]]; then
  ctest --output-on-failure -j "$jobs" "$@" -LE 'mpi|e2e|reference' || rc=$?
  ASAN_OPTIONS="fast_unwind_on_malloc=0:$ASAN_OPTIONS" ctest --output-on-failure -j "$jobs" "$@" -L 'mpi|e2e|reference' || rc=$?
else
  ctest --output-on-failure -j "$jobs" "$@" || rc=$?
fi
found=("$reports"/*)
if [[ -e ${found[0]} ]]; then
  for f in "${found[@]}"; do
    echo "sanitize: report $f:" >&2
    head -n 80 "$f" >&2
  done
  echo "sanitize: FAILED: ${#found[@]} sanitizer report(s) in $reports" >&2
  exit 1
fi
exit "$rc"
