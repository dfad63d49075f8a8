#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (unit tests
# and the multi-rank tests at 1-4 ranks). Arguments go to ctest, e.g.
#   scripts/test.sh -R comm        # only the collective tests
#   scripts/test.sh -L mpi         # only multi-rank tests
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${ST_BUILD_DIR:-$root/build}"

"$root/scripts/setup.sh"
cd "$build_dir"
ctest --output-on-failure -j "${ST_JOBS:-$(nproc)}" "$@"
