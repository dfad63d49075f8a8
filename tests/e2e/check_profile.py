#!/usr/bin/env python3
"""Checks of the step profile (`trainer --profile`, core/profile.h); standard library only.

    check_profile.py TRAINER CHECK

Values only, never timings. CHECK is one of:
  rows         2 ranks, llama-tiny in F32 without recomputation: the peak line, one
               "profile step" line per step whose phase and activity percentages each sum
               to 100 +- LINE_SLACK, a summary table with every row, whose mean
               percentages sum to 100 +- TABLE_SLACK per column, and GEMM FLOPs per step
               equal to 6 x matmul parameters x this rank's tokens within FLOP_BOUND
               (relative), which is also the printed ratio to the model's FLOPs
               (6 x matmul parameters + the attention term, per token); the top-ops rows
               name known ops, their shares (the listed rows plus "N more ops") add up to
               the "all named ops" row +- TABLE_SLACK, which is at most 100% of the step,
               and its calls equal the op count of the GEMM line
  recompute    the same in BF16 with every decoder layer recomputed: the GEMM FLOPs
               grow by 2 x the decoder layers' matmul parameters per token (their
               forward runs again), a recompute row is non-zero, and the model FLOPs
               (which never count recomputation) stay the same
  determinism  2 ranks, BF16, recomputation: losses are bit-identical with and without
               the profile and with op-boundary MPI progress off (ST_MPI_PROGRESS=0)
               and on
Each check prints what it measured; a failure exits 1.
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, fail, metrics_rows, mpirun  # noqa: E402

CONFIG = "configs/llama-tiny.yaml"
# Per-step percentages are printed with one decimal, up to 8 of them per view.
LINE_SLACK = 0.5
# The table shows each row's mean, so a column adds up to the mean step up to
# the one-decimal rounding of its (up to 8) printed percentages.
TABLE_SLACK = 0.5
# The FLOP count is exact (it counts shapes, not time); the bound covers the
# four significant digits the summary prints.
FLOP_BOUND = 1e-3
STEPS = 8

PHASES = ["forward", "backward", "recompute", "grad sync", "optimizer", "data", "checkpoint", "eval", "other"]
ACTIVITIES = ["GEMM", "other ops", "wait all-gather", "wait reduce", "wait other comm", "MPI progress", "rest"]
# Rows of the summary's top-ops table (core/profile.cpp's kTopOps).
TOP_OPS = 8
# The names core/ops.cpp, core/ops_nn.cpp and the trainer give to profile::op.
OP_NAMES = {
    "gemm", "add", "scale", "axpy", "cast", "sum of squares", "fill", "embedding forward", "embedding backward",
    "rmsnorm forward", "rmsnorm backward", "add+rmsnorm forward", "rmsnorm+add backward", "rope tables",
    "rope forward", "rope backward", "attention forward", "attention backward", "swiglu forward", "swiglu backward", "relu forward", "relu backward",
    "cross-entropy loss", "mse loss", "optimizer update",
}


def run(trainer, np, sets, env=None, metrics=None):
    cmd = mpirun(np) + [trainer, "--config", CONFIG, "--steps", str(STEPS)]
    for s in sets:
        cmd += ["--set", s]
    if metrics:
        cmd += ["--set", f"logging.metrics_file={metrics}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        fail(f"exit {proc.returncode}: {' '.join(cmd)}")
    return proc.stdout + proc.stderr


def model_counts(sets):
    """Matmul parameters (decoder layers, lm_head) and attention FLOPs per token of llama-tiny."""
    d, inter, layers, heads, kv, vocab, seq = 64, 172, 2, 4, 2, 256, 32
    for s in sets:
        if s.startswith("train.seq_len="):
            seq = int(s.split("=")[1])
    hd = d // heads
    per_layer = d * d + 2 * kv * hd * d + d * d + 3 * d * inter
    attention = 12 * layers * seq * heads * hd
    return per_layer * layers, vocab * d, attention, seq


def percents(segment):
    return [float(x) for x in re.findall(r" ([0-9.]+)%", segment)]


def check_top_ops(out):
    """The summary's top-ops rows: known names, shares that add up, calls that match the op count."""
    head = re.search(r"  top ops \(of (\d+)\) +ms +% +calls\n", out)
    if not head:
        fail("summary lacks the 'top ops' table")
    named = int(head.group(1))
    rows = []
    for line in out[head.end():].splitlines():
        m = re.search(r"INFO      (\S.*?) +([0-9.]+) +([0-9.]+)% +(\d+)$", line)
        if not m:
            break
        rows.append((m.group(1), float(m.group(2)), float(m.group(3)), int(m.group(4))))
    if not rows or rows[-1][0] != "all named ops":
        fail(f"top-ops table does not end with 'all named ops': {rows}")
    *listed, total = rows
    more = [r for r in listed if re.fullmatch(r"\d+ more ops", r[0])]
    ops = [r for r in listed if r not in more]
    if len(ops) != min(named, TOP_OPS) or len(more) != (1 if named > TOP_OPS else 0):
        fail(f"top-ops table of {named} ops lists {len(ops)} ops and {len(more)} 'more' rows")
    unknown = [r[0] for r in ops if r[0] not in OP_NAMES]
    if unknown or len({r[0] for r in ops}) != len(ops):
        fail(f"top-ops rows name unknown or repeated ops: {[r[0] for r in ops]}")
    if [r[1] for r in ops] != sorted((r[1] for r in ops), reverse=True):
        fail("top-ops rows are not longest first")
    shares = sum(r[2] for r in listed)
    print(f"top ops: {', '.join(r[0] for r in ops)}; rows sum to {shares:.1f}%, "
          f"all {named} named ops {total[2]:.1f}% of the step in {total[3]} calls")
    if abs(shares - total[2]) > TABLE_SLACK:
        fail(f"top-ops rows sum to {shares:.1f}%, but 'all named ops' says {total[2]:.1f}%")
    if total[2] > 100.0:
        fail(f"named ops take {total[2]:.1f}% of the step, more than all of it")
    count = re.search(r"FLOP per step in (\d+) ops \(all ops\)", out)
    if not count or int(count.group(1)) != total[3]:
        fail(f"'all named ops' has {total[3]} calls, the GEMM line {count and count.group(1)} ops")


def check_output(out, sets, np, recompute):
    if not re.search(r"profile: GEMM peak [0-9.]+ GFLOP/s per rank \(1024\^3 (F32|BF16) through ops::gemm, best of 5",
                     out):
        fail("no 'profile: GEMM peak' line")
    if not re.search(r"profile: GEMM peak re-measured at the end of the run: [0-9.]+ GFLOP/s per rank "
                     r"\(start-up [0-9.]+\)", out):
        fail("no 'GEMM peak re-measured at the end' line")
    # No share of the peak above 100%, and a clamped one says why.
    shares = [float(x) for x in re.findall(r"([0-9.]+)% of (?:peak|the measured peak|the GEMM peak)", out)]
    if not shares or max(shares) > 100:
        fail(f"shares of the peak {shares}: none, or one above 100%")
    if re.search(r"clamped(?!: (above the|the GEMMs ran above))", out):
        fail("a share of the peak is clamped without saying why")
    lines = re.findall(r"profile step (\d+): ([0-9.]+) s \|([^|]*)\|([^|]*)\|", out)
    if [int(s) for s, *_ in lines] != list(range(1, STEPS + 1)):
        fail(f"expected one profile line per step 1..{STEPS}, got steps {[s for s, *_ in lines]}")
    for step, _, phases, activities in lines:
        for name, seg in (("phase", phases), ("activity", activities)):
            total = sum(percents(seg))
            if abs(total - 100) > LINE_SLACK:
                fail(f"step {step}: {name} percentages sum to {total:.1f}, not 100 +- {LINE_SLACK}")
    print(f"{len(lines)} step lines; each view sums to 100% +- {LINE_SLACK}")

    table = {}
    for name in PHASES + ACTIVITIES + ["step"]:
        m = re.findall(r"  " + re.escape(name) + r" +([0-9.]+) +([0-9.]+)%", out)
        if not m:
            fail(f"summary table lacks the row '{name}'")
        table[name] = (float(m[0][0]), float(m[0][1]))
    for name, rows in (("phase", PHASES), ("activity", ACTIVITIES)):
        total = sum(table[r][1] for r in rows)
        print(f"summary: {name} means sum to {total:.1f}% of the mean step")
        if abs(total - 100) > TABLE_SLACK:
            fail(f"summary {name} column sums to {total:.1f}%, not 100 +- {TABLE_SLACK}")
    if table["GEMM"][0] <= 0 or table["forward"][0] <= 0 or table["backward"][0] <= 0:
        fail("GEMM, forward and backward must take time")
    if recompute and table["recompute"][0] <= 0:
        fail("recomputation is on but the recompute row is 0")
    if not recompute and table["recompute"][0] != 0:
        fail("no recomputation, but the recompute row is not 0")

    check_top_ops(out)

    layer_mm, head_mm, attention, seq = model_counts(sets)
    tokens = 12 * seq // np  # global batch 12 over np ranks
    gemm_per_token = 6 * (layer_mm + head_mm) + (2 * layer_mm if recompute else 0)
    model_per_token = 6 * (layer_mm + head_mm) + attention
    m = re.search(r"GEMM: ([0-9.e+-]+) FLOP per step", out)
    r = re.search(r"GEMM FLOPs / model FLOPs = ([0-9.]+)", out)
    mf = re.search(r"model: ([0-9.e+-]+) FLOP per step on this rank", out)
    if not (m and r and mf):
        fail("summary lacks the GEMM and model FLOP lines")
    gemm, ratio, model = float(m.group(1)), float(r.group(1)), float(mf.group(1))
    expected = gemm_per_token * tokens
    print(f"GEMM FLOPs per step {gemm:.4e}, expected {expected:.4e} ({gemm_per_token} x {tokens} tokens); "
          f"model {model:.4e}, expected {model_per_token * tokens:.4e}; ratio {ratio}")
    if abs(gemm / expected - 1) > FLOP_BOUND:
        fail(f"GEMM FLOPs {gemm:.4e} differ from {expected:.4e} by more than {FLOP_BOUND}")
    if abs(model / (model_per_token * tokens) - 1) > FLOP_BOUND:
        fail(f"model FLOPs {model:.4e} differ from {model_per_token * tokens:.4e}")
    if abs(ratio - gemm_per_token / model_per_token) > FLOP_BOUND:
        fail(f"printed ratio {ratio} is not {gemm_per_token / model_per_token:.4f}")


def check_rows(trainer):
    sets = ["fsdp.mixed_precision.param_dtype=f32", "fsdp.activation_checkpointing.mode=none", "logging.profile=true"]
    check_output(run(trainer, 2, sets), sets, 2, recompute=False)


def check_recompute(trainer):
    sets = ["fsdp.mixed_precision.param_dtype=bf16", "fsdp.activation_checkpointing.mode=full"]
    out = run(trainer, 2, sets + ["logging.profile=true"])
    check_output(out, sets, 2, recompute=True)


def losses(trainer, sets, env, tmp, name):
    path = os.path.join(tmp, name + ".jsonl")
    run(trainer, 2, sets, env=env, metrics=path)
    return [r["loss"] for r in metrics_rows(path)]


def check_determinism(trainer):
    sets = ["fsdp.mixed_precision.param_dtype=bf16", "fsdp.activation_checkpointing.mode=full"]
    with tempfile.TemporaryDirectory() as tmp:
        base = losses(trainer, sets, {"ST_MPI_PROGRESS": "0"}, tmp, "off")
        for name, extra, env in (("progress", [], {"ST_MPI_PROGRESS": "1"}),
                                 ("progress+profile", ["logging.profile=true"], {"ST_MPI_PROGRESS": "1"}),
                                 ("profile", ["logging.profile=true"], {"ST_MPI_PROGRESS": "0"})):
            got = losses(trainer, sets + extra, env, tmp, name)
            if got != base:
                fail(f"losses with {name} differ from the plain run: {got} vs {base}")
            print(f"{name}: {len(got)} losses bit-identical to the run without progress or profile")


def main():
    if len(sys.argv) != 3:
        fail(__doc__)
    trainer, check = sys.argv[1], sys.argv[2]
    {"rows": check_rows, "recompute": check_recompute, "determinism": check_determinism}[check](trainer)
    print("OK")


if __name__ == "__main__":
    main()
