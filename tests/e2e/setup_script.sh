#!/usr/bin/env bash
# scripts/setup.sh in a copied checkout: a build folder whose CMakeCache.txt
# names another checkout is refused with one line saying what to do (exit 1),
# before any package or CMake step; a cache of this checkout goes on to CMake.
# cmake and dpkg-query are stand-ins on PATH that record their arguments, so
# nothing is installed or built.
#   tests/e2e/setup_script.sh
set -uo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
check() {  # check NAME CONDITION-RESULT DETAIL
  if [[ $2 -eq 0 ]]; then echo "ok   $1"; else echo "FAIL $1: $3"; failures=$((failures + 1)); fi
}

copy="$tmp/copy"
mkdir -p "$copy/scripts" "$copy/build" "$tmp/bin"
cp "$src/scripts/setup.sh" "$copy/scripts/"
printf '#!/bin/sh\necho "cmake $*" >> "%s/cmake.log"\n' "$tmp" > "$tmp/bin/cmake"
printf '#!/bin/sh\nprintf "install ok installed"\n' > "$tmp/bin/dpkg-query"
chmod +x "$tmp/bin/cmake" "$tmp/bin/dpkg-query"
export PATH="$tmp/bin:$PATH"

# The cache as the original checkout's configure wrote it.
printf '# For build in directory: /home/me/shardtrain/build\nCMAKE_CACHEFILE_DIR:INTERNAL=/home/me/shardtrain/build\n'\
'CMAKE_HOME_DIRECTORY:INTERNAL=/home/me/shardtrain\n' > "$copy/build/CMakeCache.txt"
err="$("$copy/scripts/setup.sh" 2>&1 >/dev/null)"
rc=$?
want="setup: $copy/build was configured by another checkout (its CMakeCache.txt names source /home/me/shardtrain, \
build /home/me/shardtrain/build); remove it (rm -rf $copy/build) or build elsewhere \
(ST_BUILD_DIR=$copy/build-new scripts/setup.sh)"
[[ $rc -eq 1 && "$err" == "$want" && ! -e "$tmp/cmake.log" ]]
check copied_cache $? "exit $rc, stderr: $err"

# This checkout's own cache: on to CMake's configure and build.
printf 'CMAKE_CACHEFILE_DIR:INTERNAL=%s/build\nCMAKE_HOME_DIRECTORY:INTERNAL=%s\n' "$copy" "$copy" \
  > "$copy/build/CMakeCache.txt"
ST_JOBS=1 "$copy/scripts/setup.sh" >/dev/null 2>&1
rc=$?
log="$(cat "$tmp/cmake.log" 2>/dev/null)"
[[ $rc -eq 0 && "$log" == "cmake -S $copy -B $copy/build -G Ninja -DST_WERROR=ON"$'\n'"cmake --build $copy/build -j 1" ]]
check own_cache $? "exit $rc, cmake calls: $log"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
