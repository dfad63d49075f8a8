#!/usr/bin/env bash
# The trainer's own checkpoints against the disk, in one run: for each world
# size, repeats interleaved, the trainer (bench/configs/ckpt-1gb.yaml, about
# 1 GB of training state) saves in each layout, then resumes from the files
# (page cache dropped) at the same world size and at another one
# (resharded), and ckpt_bench measures raw write+fsync and read of the same
# number of bytes, and a host copy of the state, over the same ranks. The
# trainer reports its own times (the "saved checkpoint ... in X s", "state
# copied to host in X s" and "resumed ... read in X s" lines).
#
#   bench/ckpt_trainer_bench.sh [--dir /tmp/ckt] [--repeats 5] [--ranks "1 2 4"] [--out DIR] [--no-build]
#                               [--trainer PATH]   (another build's trainer, e.g. an older commit's)
#
# Prints one table row per (world size, figure): median seconds, GB/s of
# checkpoint file bytes, the ratio to raw (write+fsync for saves, read for
# loads, host copy for the async save's blocked time) and every repeat.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=/tmp/ckt
repeats=5
ranks="1 2 4"
out=""
build=1
settle=2
trainer=build/trainer
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --settle) settle="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --trainer) trainer="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "ckpt_trainer_bench: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out="$(mktemp -d /tmp/ckpt_trainer_bench.XXXXXX)"
mkdir -p "$out" "$dir"
if [ "$build" = 1 ]; then
  cmake --build build --target trainer ckpt_bench >/dev/null
fi
config=bench/configs/ckpt-1gb.yaml
results="$out/results.tsv"  # world  figure  seconds  bytes
: > "$results"

quiet() { sync; sleep "$settle"; }
# The first number after `$2` on the line of log file $1 that matches $3.
seconds_after() { grep -E "$3" "$1" | head -1 | sed -E "s/.*$2 ([0-9.]+) s.*/\\1/"; }
last_seconds_after() { grep -E "$3" "$1" | tail -1 | sed -E "s/.*$2 ([0-9.]+) s.*/\\1/"; }
file_bytes() { find "$1" -name '*.safetensors' -printf '%s\n' | awk '{s += $1} END {print s}'; }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$results"; }
other_world() { case "$1" in 1) echo 2 ;; 2) echo 4 ;; *) echo 2 ;; esac; }

for rep in $(seq "$repeats"); do
  for w in $ranks; do
    for layout in unified sharded; do
      root="$dir/w$w-$layout"
      rm -rf "$root"
      log="$out/w$w-$layout-r$rep"
      quiet
      scripts/launch -np "$w" "$trainer" --config "$config" --set checkpoint.dir="$root" \
        --set checkpoint.format="$layout" > "$log.save" 2>&1
      step="$root/step-000001"
      bytes=$(file_bytes "$step")
      record "$w" "$layout save" "$(seconds_after "$log.save" in 'saved checkpoint')" "$bytes"
      for lw in "$w" "$(other_world "$w")"; do
        build/ckpt_bench --drop-cache "$step" > /dev/null
        quiet
        scripts/launch -np "$lw" "$trainer" --config "$config" --resume "$step" --steps 2 > "$log.load$lw" 2>&1
        figure="$layout load"
        [ "$lw" = "$w" ] || figure="$layout load resharded"
        record "$w" "$figure" "$(seconds_after "$log.load$lw" in 'resumed from')" "$bytes"
      done
      if [ "$layout" = unified ]; then
        rm -rf "$root"
        quiet
        # Three saves, one a step; the third is timed: by then the snapshot
        # reuses the host buffers the allocator kept from the earlier ones, as
        # every save but a run's first does.
        scripts/launch -np "$w" "$trainer" --config "$config" --set checkpoint.dir="$root" \
          --set checkpoint.async=true --set checkpoint.interval=1 --steps 3 > "$log.async" 2>&1
        record "$w" "async blocked" "$(last_seconds_after "$log.async" in 'state copied to host')" "$bytes"
        # The disk and memory for the same bytes, on the same ranks: the median
        # of 3 (a fresh process's first write also pays for fresh page-cache
        # pages from the host, which the trainer's save does not).
        scripts/launch -np "$w" build/ckpt_bench --layouts none --bytes "$bytes" --repeats 3 --settle "$settle" \
          --dir "$dir" > "$log.raw" 2>&1
        for f in "write+fsync" "read" "host copy"; do
          # Columns: layout op [op] GB median-seconds GB/s vs-raw and the 3 repeats.
          row=$(awk -v f="$f" '($1 == "raw" || $1 == "memory") && index($0, " " f " ") {print; exit}' "$log.raw")
          record "$w" "raw $f" "$(awk '{print $(NF-5)}' <<< "$row")" "$(awk '{printf "%.0f", $(NF-6) * 1e9}' <<< "$row")"
        done
      fi
      rm -rf "$root"
    done
  done
  echo "ckpt_trainer_bench: repeat $rep/$repeats done" >&2
done

# Summary: medians, GB/s, ratio to the raw figure for the same bytes.
/usr/bin/env python3 - "$results" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    w, fig, secs, nbytes = line.rstrip("\n").split("\t")
    rows.setdefault((int(w), fig), []).append((float(secs), float(nbytes)))
def gbps(w, fig):
    v = rows[(w, fig)]
    return statistics.median(b / s for s, b in v) / 1e9
print(f"{'world':>5} {'figure':<26} {'median s':>9} {'GB':>6} {'GB/s':>7} {'vs raw':>7}  seconds of each repeat")
for (w, fig), v in sorted(rows.items()):
    secs = [s for s, _ in v]
    raw = None
    if fig.endswith("save"): raw = "raw write+fsync"
    elif "load" in fig: raw = "raw read"
    elif fig == "async blocked": raw = "raw host copy"
    ratio = ""
    if raw and (w, raw) in rows:
        ratio = (f"{gbps(w, fig) / gbps(w, raw):.2f}" if fig != "async blocked"
                 else f"{statistics.median(secs) / statistics.median(s for s, _ in rows[(w, raw)]):.2f}x")
    print(f"{w:>5} {fig:<26} {statistics.median(secs):>9.3f} {v[0][1] / 1e9:>6.3f} {gbps(w, fig):>7.3f} {ratio:>7}  "
          + " ".join(f"{s:.3f}" for s in secs))
PY
echo "ckpt_trainer_bench: logs and results.tsv in $out" >&2
