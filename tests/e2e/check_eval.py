#!/usr/bin/env python3
"""End-to-end checks of validation during training (eval.*, data.val_path, data.val_fraction).

    check_eval.py TRAINER CHECK

CHECK is one of:
  steps       llama-tiny, 20 steps, eval.interval 7, logging.interval 5, at 2 ranks: the metrics
              file has val_loss (and val_ppl = exp(val_loss)) at exactly steps 7, 14 and 20, which
              are logged although logging.interval would skip 7 and 14; their step lines end in
              "| val_loss L (ppl P)", each evaluation logs a line with its time, and the done line
              names the final and best validation loss
  unchanged   evaluation does not change training: the losses and gradient norms of every step
              are bit-identical with eval.interval 3 and without, at 1 rank, at 2 ranks and at
              2 ranks with NO_SHARD (whose units stay gathered between steps); the validation
              losses are bit-identical at 1 and 2 ranks (each micro-batch's sum reaches every
              rank exactly and the sums are added in sample order, so the world size does not
              change the rounding)
  resume      2 ranks, 20 steps, eval.interval 5: --stop-after 12, then --resume auto, evaluates
              at steps 5, 10 and 15, 20 with validation losses bit-identical to an uninterrupted run
  text        llama-tiny on GPL-3 with data.val_fraction 0.1 (the last 10% held out) and with
              data.val_path GPL-2: the log describes the split, and the last validation loss is
              below the first and below ln 256 (the loss of a uniform byte guess)
  toy         the toy model (MSE, no tokens) evaluates on held-out draws: val_loss, no val_ppl,
              and the validation loss falls from step 10 to step 40
  bad-input   a missing data.val_path, eval.interval without validation data, data.val_path with
              synthetic data and eval.batches beyond the validation data fail with one line naming
              the file or the keys
Each check prints what it measured; a failure exits 1.
"""
import math
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, TEXT, check_main, fail, metrics_rows, mpirun  # noqa: E402

TINY = "configs/llama-tiny.yaml"
OTHER_TEXT = "/usr/share/common-licenses/GPL-2"


def run(trainer, np, sets, tmp, name, config=TINY, extra=(), expect_ok=True):
    """Runs the trainer; returns (metrics rows, log text)."""
    metrics = os.path.join(tmp, f"{name}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = mpirun(np) + [trainer, "--config", config, "--set", f"logging.metrics_file={metrics}"]
    for s in sets:
        cmd += ["--set", s]
    cmd += list(extra)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    if expect_ok and proc.returncode != 0:
        sys.stderr.write(out[-4000:])
        fail(f"exit {proc.returncode}: {' '.join(cmd)}")
    rows = metrics_rows(metrics) if os.path.exists(metrics) else []
    return rows, out, proc.returncode


def evals(rows):
    return {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}


def check_steps(trainer, tmp):
    rows, out, _ = run(trainer, 2, ["train.steps=20", "eval.interval=7", "logging.interval=5"], tmp, "steps")
    got = evals(rows)
    if sorted(got) != [7, 14, 20]:
        fail(f"val_loss at steps {sorted(got)}, expected exactly 7, 14, 20")
    if [r["step"] for r in rows] != list(range(1, 21)):
        fail(f"metrics file steps {[r['step'] for r in rows]}, expected every step 1..20")
    logged = [int(s) for s in re.findall(r"step (\d+)/20 \|", out)]
    if logged != [5, 7, 10, 14, 15, 20]:
        fail(f"step lines at steps {logged}, expected 5, 7, 10, 14, 15, 20 (every 5th and every evaluation)")
    for r in rows:
        if "val_loss" in r and abs(r["val_ppl"] / math.exp(r["val_loss"]) - 1) > 1e-15:
            fail(f"step {r['step']}: val_ppl {r['val_ppl']} is not exp(val_loss {r['val_loss']})")
        if "val_loss" not in r and "val_ppl" in r:
            fail(f"step {r['step']}: val_ppl without val_loss")
    for step, loss in got.items():
        ppl = math.exp(loss)
        line = re.search(rf"step {step}/20 \|.*\| val_loss {loss:.4f} \(ppl {ppl:.1f}\)\n", out)
        if not line:
            fail(f"no step line for step {step} ending in '| val_loss {loss:.4f} (ppl {ppl:.1f})'")
        if not re.search(rf"eval step {step}: val_loss {loss:.4f} \(ppl {ppl:.1f}\) over 48 sequences "
                         rf"\(1,536 tokens\) in [0-9.]+ s", out):
            fail(f"no eval line with its time for step {step}")
    if re.search(r"step (5|10|15)/20 .*val_loss", out):
        fail("a step without an evaluation shows val_loss")
    best = min(got, key=got.get)
    done = f"final loss {rows[-1]['loss']:.4f}, val_loss {got[20]:.4f} (best {got[best]:.4f} at step {best})"
    if done not in out:
        fail(f"the done line does not say: {done}")
    print(f"steps: val_loss at steps {sorted(got)}: " + ", ".join(f"{got[s]:.4f}" for s in sorted(got)) +
          f"; step lines, eval lines and '{done}' present")


def train_rows(rows):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows]


def check_unchanged(trainer, tmp):
    vals = {}
    for np, extra in ((1, []), (2, []), (2, ["fsdp.sharding_strategy=NO_SHARD"])):
        sets = ["train.steps=20"] + extra
        off, _, _ = run(trainer, np, sets, tmp, f"off{np}")
        on, _, _ = run(trainer, np, sets + ["eval.interval=3", "logging.interval=1"], tmp, f"on{np}")
        what = f"np {np}{' ' + extra[0] if extra else ''}"
        if train_rows(off) != train_rows(on):
            fail(f"{what}: training losses or gradient norms differ with evaluation on")
        print(f"unchanged: {what}: 20 training losses and gradient norms bit-identical with eval.interval 3 "
              f"({len(evals(on))} evaluations) and without")
        vals[what] = evals(on)
    if vals["np 1"] != vals["np 2"]:
        fail(f"validation losses differ between 1 and 2 ranks: {vals['np 1']} vs {vals['np 2']}")
    print(f"unchanged: validation losses at 1 and 2 ranks bit-identical at {len(vals['np 1'])} steps "
          f"({vals['np 1'][3]:.6f} .. {vals['np 1'][20]:.6f})")


def check_resume(trainer, tmp):
    ckpt = os.path.join(tmp, "ckpt")
    sets = ["train.steps=20", "eval.interval=5", "checkpoint.interval=0", f"checkpoint.dir={ckpt}"]
    whole, _, _ = run(trainer, 2, sets[:-1], tmp, "whole")
    first, _, _ = run(trainer, 2, sets, tmp, "first", extra=["--stop-after", "12"])
    second, out, _ = run(trainer, 2, sets, tmp, "second", extra=["--resume", "auto"])
    want = evals(whole)
    got = {**evals(first), **evals(second)}
    if sorted(want) != [5, 10, 15, 20] or got != want:
        fail(f"evaluations {got} after a stop at 12 and a resume, expected {want}")
    if sorted(evals(second)) != [15, 20]:
        fail(f"the resumed run evaluated at {sorted(evals(second))}, expected 15, 20")
    print(f"resume: stopped after 12, resumed: evaluations at {sorted(got)} bit-identical to the uninterrupted run")


def check_text(trainer, tmp):
    for sets, expect in ((["data.val_fraction=0.1"], "the last 110 samples, [988, 1098), held out"),
                         ([f"data.val_path={OTHER_TEXT}"], f"validation: text {OTHER_TEXT}")):
        rows, out, _ = run(trainer, 2, ["data.kind=text", f"data.path={TEXT}", "eval.interval=20"] + sets, tmp, "text")
        if expect not in out:
            fail(f"the log does not say '{expect}'")
        got = evals(rows)
        steps = sorted(got)
        first, last = got[steps[0]], got[steps[-1]]
        print(f"text {sets[0]}: val_loss {first:.4f} at step {steps[0]} -> {last:.4f} at step {steps[-1]} "
              f"(uniform bytes: {math.log(256):.4f}); log: '{expect}'")
        if steps != [20, 40, 60] or not last < first or not last < math.log(256):
            fail("the validation loss did not fall below the first evaluation's and ln 256")


def check_toy(trainer, tmp):
    rows, out, _ = run(trainer, 1, ["train.steps=40", "eval.interval=10", "eval.batches=16"], tmp, "toy",
                       config="configs/toy.yaml")
    got = evals(rows)
    if sorted(got) != [10, 20, 30, 40] or any("val_ppl" in r for r in rows) or "ppl" in out:
        fail(f"toy: evaluations {got}; val_ppl must not appear for a model without tokens")
    if "draws 4,096 on (held out: training never sees them)" not in out:
        fail("toy: the log does not describe the held-out draws")
    print(f"toy: val_loss (MSE on 384 held-out draws) {got[10]:.5f} at step 10 -> {got[40]:.5f} at step 40; "
          "no perplexity")
    if not got[40] < got[10]:
        fail("toy: the validation loss did not fall")


def expect_error(trainer, tmp, sets, *texts):
    _, out, code = run(trainer, 2, sets, tmp, "bad", expect_ok=False)
    errors = [line for line in out.splitlines() if "error:" in line]
    if code == 0 or len(errors) != 1 or any(t not in errors[0] for t in texts):
        sys.stderr.write(out[-3000:])
        fail(f"expected exit != 0 and one error line with {texts}; got exit {code}, {errors}")
    print(f"bad-input: exit {code}: {errors[0].strip()}")


def check_bad_input(trainer, tmp):
    missing = os.path.join(tmp, "no-such-val.bin")
    tokens = os.path.join(tmp, "train.bin")  # headerless uint16 tokens below model.vocab_size
    with open(tokens, "wb") as f:
        f.write(bytes(i % 251 for i in range(20000)))
    expect_error(trainer, tmp, ["data.kind=tokens", "data.token_format=headerless", f"data.path={tokens}",
                                f"data.val_path={missing}",
                                "eval.interval=5"],
                 f"tokens path '{missing}' (data.val_path) does not exist")
    expect_error(trainer, tmp, ["data.kind=text", f"data.path={TEXT}", f"data.val_path={missing}", "eval.interval=5"],
                 f"text file '{missing}' (data.val_path) does not exist")
    expect_error(trainer, tmp, ["data.kind=text", f"data.path={TEXT}", "eval.interval=5"],
                 "eval.interval is 5 but there is no validation data", "data.val_path", "data.val_fraction")
    expect_error(trainer, tmp, [f"data.val_path={TEXT}"], "'data.val_path'", "data.kind synthetic")
    expect_error(trainer, tmp, ["data.kind=text", f"data.path={TEXT}", "data.val_fraction=0.01", "eval.interval=5"],
                 "the validation data has 11 samples, fewer than eval.batches 4 x train.global_batch_size 12 = 48",
                 "give more validation data")


def main():
    check_main({"steps": check_steps, "unchanged": check_unchanged, "resume": check_resume, "text": check_text,
                "toy": check_toy, "bad-input": check_bad_input})


if __name__ == "__main__":
    main()
