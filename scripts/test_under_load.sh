#!/usr/bin/env bash
# The test suite on a busy machine: ROUNDS (default 3) full runs of
# scripts/test.sh in a row while HOGS (default 2) CPU-bound busy loops run
# beside it, as in a shared CI machine. Fault tests must synchronise with the
# program (core/test_hook.h), never with the clock, so this passes as the idle
# suite does. The busy loops end with this script, also when it is stopped.
#
#   scripts/test_under_load.sh                 # 3 rounds, 2 hogs
#   ROUNDS=1 HOGS=4 scripts/test_under_load.sh -R ckpt_   # extra arguments go to ctest
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds="${ROUNDS:-3}"
hogs="${HOGS:-2}"
pids=()
stop_hogs() { ((${#pids[@]})) && kill "${pids[@]}" 2>/dev/null; }
trap stop_hogs EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < hogs; i++)); do
  bash -c 'while :; do :; done' &
  pids+=($!)
done
echo "test_under_load: ${#pids[@]} busy loops (pids ${pids[*]}), $rounds round(s)"
for ((r = 1; r <= rounds; r++)); do
  start=$(date +%s)
  if ! "$root/scripts/test.sh" "$@"; then
    echo "test_under_load: round $r of $rounds FAILED after $(($(date +%s) - start)) s" >&2
    exit 1
  fi
  echo "test_under_load: round $r of $rounds passed in $(($(date +%s) - start)) s"
done
echo "test_under_load: all $rounds round(s) passed beside $hogs busy loop(s)"
