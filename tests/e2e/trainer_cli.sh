#!/usr/bin/env bash
# End-to-end checks of the trainer binary's error handling: a bad config must
# fail with exit code 1, a bad argument with exit code 2 (core/cli.h), and
# one line naming the problem.
#   tests/e2e/trainer_cli.sh BUILD/trainer
set -uo pipefail
trainer="$(realpath "$1")"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect_error NAME EXPECTED_TEXT -- COMMAND...: exit 1 (or $code when set,
# e.g. code=2 expect_error ...), stderr contains the text.
expect_error() {
  local name="$1" want="$2" expected="${code:-1}"
  shift 3
  local out rc
  out="$("$@" 2>&1 >/dev/null)"
  rc=$?
  if [[ $rc -ne $expected ]]; then
    echo "FAIL $name: exit code $rc, expected $expected (output: $out)"
    failures=$((failures + 1))
  elif [[ "$out" != *"$want"* ]]; then
    echo "FAIL $name: stderr was: $out"
    echo "     expected it to contain: $want"
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

cd "$tmp"
# A minimal valid config for the checks that are about flags and --set.
printf 'train:\n  steps: 1\n' > min.yaml
# Line 7 holds the typo: the message must name the key, file:line and the fix.
cat > llama.yaml <<'YAML'
model:
  name: llama
train:
  steps: 3
fsdp:
  auto_wrap: {policy: none}
  sharding_stratgy: NO_SHARD
YAML
expect_error typo_key "unknown key 'fsdp.sharding_stratgy' at llama.yaml:7; did you mean 'sharding_strategy'?" -- \
  "$trainer" --config llama.yaml
expect_error bad_set "did you mean 'fsdp.sharding_strategy'?" -- \
  "$trainer" --config min.yaml --set fsdp.sharding_stratgy=NO_SHARD
expect_error missing_file "missing.yaml" -- "$trainer" --config missing.yaml
code=2 expect_error no_config "missing --config FILE" -- "$trainer" --steps 2
expect_error empty_config "config file '/dev/null' is not a regular file" -- "$trainer" --config /dev/null
: > empty.yaml
expect_error comment_only_config "config file 'empty.yaml' is empty" -- "$trainer" --config empty.yaml
code=2 expect_error bad_flag "unknown argument '--bogus'" -- "$trainer" --config min.yaml --bogus
code=2 expect_error bad_steps "--steps ten: expected a positive integer" -- "$trainer" --config min.yaml --steps=ten
code=2 expect_error huge_steps "--steps 99999999999999999999: too large (at most 9223372036854775807)" -- \
  "$trainer" --config min.yaml --steps 99999999999999999999
code=2 expect_error flag_typo "unknown argument '--step'; did you mean '--steps'? (see --help)" -- \
  "$trainer" --config min.yaml --step 10
code=2 expect_error no_arguments "usage: trainer --config FILE" -- "$trainer"
expect_error null_path "bad value for 'checkpoint.dir' in --set: got an empty value, expected a string" -- \
  "$trainer" --config min.yaml --set checkpoint.dir=~
# train.device: cuda where no GPU can be used names the key and the fix; on a
# machine with a GPU this check has nothing to test.
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "skip cuda_without_gpu: a GPU is visible"
else
  expect_error cuda_without_gpu "train.device: cuda, but" -- \
    "$trainer" --config min.yaml --set model.name=toy --set train.device=cuda --steps 1
fi

# --help's pointers lead somewhere: --profile names docs/training.md's section, which exists.
help="$("$trainer" --help)"
want='see docs/training.md, "Reading the step profile"'
if [[ "$help" != *"$want"* ]]; then
  echo "FAIL help_profile_pointer: --help does not contain: $want"
  failures=$((failures + 1))
elif ! grep -qx '## Reading the step profile' "$root/docs/training.md"; then
  echo "FAIL help_profile_pointer: docs/training.md has no '## Reading the step profile' section"
  failures=$((failures + 1))
else
  echo "ok   help_profile_pointer"
fi

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
