#!/usr/bin/env bash
# Regenerates the README's configuration reference from the code
# (each layer's visit_keys(), gathered by launch/config.cpp, through `trainer --list-keys`).
#   scripts/gen_config_docs.sh [BUILD_DIR]           # rewrite README.md in place
#   scripts/gen_config_docs.sh --check [BUILD_DIR]   # exit 1 if README.md is stale (a CTest test)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
check=0
if [[ "${1:-}" == "--check" ]]; then check=1; shift; fi
build_dir="${1:-$root/build}"
readme="$root/README.md"
begin='<!-- config-keys:begin'
end='<!-- config-keys:end -->'

table="$("$build_dir/trainer" --list-keys)"
new="$(awk -v b="$begin" -v e="$end" -v t="$table" '
  index($0, b) == 1 { print; print ""; print t; print ""; skip = 1; next }
  index($0, e) == 1 { skip = 0 }
  !skip { print }' "$readme")"

if [[ $check -eq 1 ]]; then
  if [[ "$new" != "$(cat "$readme")" ]]; then
    echo "README.md's configuration reference is stale: run scripts/gen_config_docs.sh" >&2
    diff <(cat "$readme") <(printf '%s\n' "$new") >&2 || true
    exit 1
  fi
  echo "README.md configuration reference is current"
else
  printf '%s\n' "$new" > "$readme"
fi
