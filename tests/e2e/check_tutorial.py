#!/usr/bin/env python3
"""docs/TUTORIAL.md runs as written (standard library only; rsvg-convert for the plot).

    check_tutorial.py BUILD_DIR [WORK_DIR]

Every ```sh block of the tutorial is run, in order, as one bash script each
(`set -eo pipefail`), from a scratch directory that holds what a fresh clone
holds next to the reader: `build/` (BUILD_DIR), `configs/`, `scripts/` and
`docs/`. `scripts/setup.sh` is not run again (CI has just run it). Blocks
fenced as ```python or ```text are shown to the reader but not run (the
tutorial says why). The test fails when a block exits non-zero,
and then checks what the tutorial promises: the validation losses it states
(within the tolerance it states, which are VAL_LOSS and TOLERANCE here), the
output of its "watch the loss" commands (step, loss and val_loss first), the
start and resume lines of the metrics file, a plot titled by the run name (rendered to PNG with a real renderer, whose path is
printed), generated text (printed), and the toy flow's checkpoint.
"""
import math
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, fail, metrics_lines, metrics_rows  # noqa: E402

TUTORIAL = os.path.join(ROOT, "docs", "TUTORIAL.md")
# What the tutorial's commands produce (each path is also checked to appear in the text).
METRICS = "runs/fortunes/metrics.jsonl"
PLOT = "runs/fortunes/metrics.jsonl.svg"
SAMPLE = "runs/fortunes/sample.txt"
TOY_CKPT = "runs/toy"
# The validation losses docs/TUTORIAL.md states, and the tolerance it gives:
# measured by this test's run of the tutorial on the CI machine kind (2-core
# AMD EPYC, oneDNN); a different thread count or GEMM backend changes BF16
# rounding, which moves them by far less than TOLERANCE.
VAL_LOSS = {100: 5.26, 300: 4.65, 600: 4.34}  # measured 5.2566, 4.6450, 4.3380
TOLERANCE = 0.15


def blocks(text):
    """(info, body) of every fenced block, in order."""
    return re.findall(r"^```(\w*)[^\n]*\n(.*?)^```", text, flags=re.S | re.M)


def scratch_dir(build, work):
    if os.path.exists(work):
        shutil.rmtree(work)
    os.makedirs(work)
    os.symlink(build, os.path.join(work, "build"))
    for name in ("configs", "scripts", "docs"):
        os.symlink(os.path.join(ROOT, name), os.path.join(work, name))


def run_blocks(runnable, work):
    """Runs each block; returns everything they printed."""
    printed = ""
    for i, body in enumerate(runnable, 1):
        t0 = time.time()
        proc = subprocess.run(["bash", "-c", "set -eo pipefail\n" + body], cwd=work, capture_output=True, text=True)
        first = body.strip().splitlines()[0]
        print(f"block {i}/{len(runnable)}: exit {proc.returncode} in {time.time() - t0:5.1f} s: {first}")
        if proc.returncode != 0:
            sys.stdout.write(proc.stdout[-3000:] + proc.stderr[-3000:])
            fail(f"tutorial block {i} exited {proc.returncode}:\n{body}")
        printed += proc.stdout + proc.stderr
    return printed


def val_losses_sentence():
    """The tutorial's sentence stating VAL_LOSS and TOLERANCE."""
    steps = sorted(VAL_LOSS)
    near = ", ".join(f"{VAL_LOSS[s]:.2f} at step {s}" for s in steps[:-1])
    return (f"expect `val_loss` near {near} and {VAL_LOSS[steps[-1]]:.2f} at step {steps[-1]}, "
            f"each within {TOLERANCE:.2f}.")


def check_validation(work, text):
    rows = metrics_rows(os.path.join(work, METRICS))
    evals = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    print("validation: val_loss " + ", ".join(f"{evals[s]:.4f} (step {s})" for s in sorted(evals)))
    if sorted(evals) != [100, 200, 300, 400, 500, 600]:
        fail(f"{METRICS}: evaluations at steps {sorted(evals)}, not 100, 200, ..., 600")
    first, last = evals[100], evals[600]
    if not (math.isfinite(last) and last < first):
        fail(f"validation loss did not fall: {first} -> {last}")
    for step, want in VAL_LOSS.items():
        if want is None or abs(evals[step] - want) > TOLERANCE:
            fail(f"val_loss at step {step} is {evals[step]:.4f}; docs/TUTORIAL.md says {want} +- {TOLERANCE}")
    if val_losses_sentence() not in " ".join(text.split()):
        fail(f"docs/TUTORIAL.md does not state: {val_losses_sentence()}")
    events = [(r["event"], r["step"], r["run_name"]) for r in metrics_lines(os.path.join(work, METRICS))
              if "event" in r]
    if events != [("start", 0, "fortunes"), ("resume", 300, "fortunes")]:
        fail(f"{METRICS}: event lines {events}, not the start at 0 and the resume at 300")
    print(f"validation: within {TOLERANCE} of what the tutorial states ({val_losses_sentence()}); events {events}")


def check_watch_commands(printed):
    """The "watch the loss" commands show step, loss and val_loss, as the tutorial says."""
    shown = re.findall(r'^\{"step":(\d+),"loss":[-\d.e]+,"val_loss":[-\d.e]+$', printed, flags=re.M)
    if shown != ["100", "200", "300", "600"]:
        fail(f"the watch-the-loss commands printed step, loss, val_loss lines for steps {shown}, "
             "not 100, 200, 300 (grep | cut) and 600 (tail | cut)")
    if not re.search(r"^6$", printed, flags=re.M):
        fail("grep -c val_loss did not print 6")
    print("watch the loss: grep | cut shows steps 100, 200, 300 and tail | cut step 600, each "
          "with step, loss and val_loss; grep -c prints 6")


def check_plot(work, build):
    svg = os.path.join(work, PLOT)
    if not os.path.isfile(svg):
        fail(f"no plot at {PLOT}")
    with open(svg, encoding="utf-8") as f:
        drawn = f.read()
    for what in (">shardtrain: fortunes</text>", ">loss (nats/token)</text>", ">resume ("):
        if what not in drawn:
            fail(f"{PLOT} lacks {what} (the run name, the loss unit, the resume mark's key)")
    png = os.path.join(build, "tests", "tutorial_plot.png")
    subprocess.run(["rsvg-convert", "-o", png, svg], check=True)
    size = os.path.getsize(png)
    if size < 1000:
        fail(f"{png}: {size} bytes, expected a real image")
    print(f"plot: {PLOT} rendered by rsvg-convert to {png} ({size} bytes)")


def check_sample(work):
    text = open(os.path.join(work, SAMPLE), encoding="utf-8", errors="replace").read()
    if len(text.strip()) < 20:
        fail(f"{SAMPLE}: expected generated text, got {text!r}")
    print("generated sample:\n" + "\n".join("  | " + line for line in text.strip().splitlines()))


def main():
    build = os.path.abspath(sys.argv[1])
    work = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(build, "tests", "tutorial"))
    text = open(TUTORIAL, encoding="utf-8").read()
    for path in (METRICS, PLOT, SAMPLE, TOY_CKPT):
        if path not in text:
            fail(f"docs/TUTORIAL.md never names {path}, which this test checks")
    # scripts/setup.sh is what CI (or the reader) has just run; the rest runs as written.
    runnable = []
    for info, body in blocks(text):
        lines = [line for line in body.splitlines() if line.strip() != "scripts/setup.sh"]
        if info == "sh" and any(line.strip() for line in lines):
            runnable.append("\n".join(lines) + "\n")
    if len(runnable) < 8:
        fail(f"found only {len(runnable)} sh blocks in docs/TUTORIAL.md")
    scratch_dir(build, work)
    printed = run_blocks(runnable, work)
    # eval.sample_tokens: a sample at every evaluation, on 2 ranks and on 1.
    for step in (100, 300, 400, 600):
        if f"sample step {step} (48 tokens" not in printed:
            fail(f"the trainer printed no sample at step {step} (eval.sample_tokens)")
    check_watch_commands(printed)
    check_validation(work, text)
    check_plot(work, build)
    check_sample(work)
    # The toy flow: saved by 4 ranks at step 20, loaded by one process, trained on to step 30.
    toy = sorted(name for name in os.listdir(os.path.join(work, TOY_CKPT)) if name.startswith("step-"))
    if toy[-2:] != ["step-000020", "step-000030"]:
        fail(f"{TOY_CKPT}: expected checkpoints at steps 20 and 30, found {toy}")
    print(f"all {len(runnable)} command blocks of docs/TUTORIAL.md exit 0")


if __name__ == "__main__":
    main()
