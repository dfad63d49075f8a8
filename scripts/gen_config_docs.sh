#!/usr/bin/env bash
# Regenerates the configuration reference in docs/configuration.md from the code
# (each layer's visit_keys(), gathered by launch/config.cpp, through `trainer --list-keys`).
#   scripts/gen_config_docs.sh [BUILD_DIR]           # rewrite docs/configuration.md in place
#   scripts/gen_config_docs.sh --check [BUILD_DIR]   # exit 1 if it is stale (CTest readme_config_keys)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
check=0
if [[ "${1:-}" == "--check" ]]; then check=1; shift; fi
build_dir="${1:-$root/build}"
doc="$root/docs/configuration.md"
begin='<!-- config-keys:begin'
end='<!-- config-keys:end -->'

if ! grep -q "^$begin" "$doc" || ! grep -q "^$end" "$doc"; then
  echo "$doc has no '$begin ...' / '$end' pair to fill" >&2
  exit 1
fi

table="$("$build_dir/trainer" --list-keys)"
new="$(awk -v b="$begin" -v e="$end" -v t="$table" '
  index($0, b) == 1 { print; print ""; print t; print ""; skip = 1; next }
  index($0, e) == 1 { skip = 0 }
  !skip { print }' "$doc")"

if [[ $check -eq 1 ]]; then
  if [[ "$new" != "$(cat "$doc")" ]]; then
    echo "docs/configuration.md's configuration reference is stale: run scripts/gen_config_docs.sh" >&2
    diff <(cat "$doc") <(printf '%s\n' "$new") >&2 || true
    exit 1
  fi
  echo "docs/configuration.md configuration reference is current"
else
  printf '%s\n' "$new" > "$doc"
fi
