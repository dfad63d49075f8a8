#!/usr/bin/env python3
"""Run hygiene, end to end through the trainer (standard library only).

    check_hygiene.py TRAINER CHECK

CHECK is one of:
  overwrite    the same command twice into one checkpoint.dir: the second run
               continues the first (default --resume auto); --resume never there
               is an error naming the newest checkpoint and changes nothing;
               --overwrite moves the old checkpoints aside (still there, byte for
               byte) and starts from step 0; with no checkpoint the default says
               it starts fresh in one line
  messages     what a resumed or short run says: the learning rate under both
               schedules when train.steps changed, keep_last naming what it
               deletes, a finished run refused with flags that continue it
               at its final learning rate (run, they give steps 13..24 at
               lr 3e-4 with no warning), --steps 1 below warmup_steps
               clamped with a warning, skip_save_model_weight with the sharded
               layout refused, --log-level warn keeping the summary line, the
               toy's samples/s, kB-sized memory figures, the resume line saying
               why it reads fewer bytes than were saved, the resolved config at
               debug level only, and --resume PATH without checkpoint.dir warned
  errors-once  a bad key at 4 ranks prints exactly one error line; so do an
               unusable checkpoint.dir, a checkpoint that does not fit and a
               finished run; a failed job through scripts/launch ends promptly
  relative-dir a relative checkpoint.dir, run from another working directory:
               the fresh start, the resume and an unusable directory each name it
               as given and as an absolute path
Each check prints what it observed; a failure exits 1.
"""
import hashlib
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, check_main, expect, fail, mpirun, run, sets  # noqa: E402

TINY = "configs/llama-tiny.yaml"
TOY = "configs/toy.yaml"


def tree_digest(root):
    """{relative path: sha256} of every file under root."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name == ".lock":  # holds the pid of the last job that ran there
                continue
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def check_overwrite(trainer, tmp):
    root = os.path.join(tmp, "run")
    cmd = mpirun(2) + [trainer, "--config", TINY, "--steps", "20"] + sets(checkpoint__dir=root)
    first = run(cmd)
    expect(first, 0, f"--resume auto: no step directory in {root}; starting from step 0", what="fresh start")
    fresh_lines = [ln for ln in first.stderr.splitlines() if "starting from step 0" in ln]
    if len(fresh_lines) != 1:
        fail(f"the fresh start should be said in one line, got {fresh_lines}")
    # The same command again, as a requeued job would: it continues, it does not restart.
    again = run(mpirun(2) + [trainer, "--config", TINY, "--steps", "30"] + sets(checkpoint__dir=root))
    expect(again, 0, f"resumed from {root}/step-000020", "done: steps 21..30", what="default resume")
    print("overwrite: the same command again resumed from step-000020 (default --resume auto)")

    before = tree_digest(root)
    never = run(cmd + ["--resume", "never"], expect_ok=False)
    expect(never, 1, f"checkpoint.dir '{root}' already holds checkpoints (the newest is step-000030)",
           "--overwrite", what="--resume never")
    if tree_digest(root) != before:
        fail("--resume never changed the checkpoint directory")
    print("overwrite: --resume never on a used directory: exit 1 naming step-000030, nothing changed")

    over = run(cmd + ["--overwrite"])
    expect(over, 0, "--overwrite: moved 3 checkpoint(s)", "done: steps 1..20", what="--overwrite")
    aside = [n for n in os.listdir(root) if n.startswith("overwritten-")]
    if len(aside) != 1:
        fail(f"expected one overwritten-* folder, found {os.listdir(root)}")
    moved = tree_digest(os.path.join(root, aside[0]))
    old = {k: v for k, v in before.items() if k.startswith(("step-", "latest"))}
    if moved != old:
        fail("the moved-aside checkpoints differ from the old ones")
    now = sorted(n for n in os.listdir(root) if n.startswith("step-"))
    if now != ["step-000010", "step-000020"]:
        fail(f"the new run's checkpoints are {now}")
    print(f"overwrite: --overwrite moved {len(old)} files of the old run to {aside[0]} unchanged; new run 1..20")


def check_messages(trainer, tmp):
    root = os.path.join(tmp, "msg")
    run([trainer, "--config", TINY, "--stop-after", "10"] + sets(checkpoint__dir=root))
    longer = run([trainer, "--config", TINY, "--steps", "100", "--stop-after", "11"] + sets(checkpoint__dir=root))
    out = expect(longer, 0, "the learning-rate schedule differs from the checkpoint's (train.steps 60 -> 100, "
                            "cosine -> cosine): step 11 uses lr", what="schedule change")
    line = [ln for ln in out.splitlines() if "schedule differs" in ln][0]
    ours, theirs = line.split("uses lr ")[1].split(" under this run's schedule, ")
    theirs = theirs.split(" ")[0]
    if abs(float(ours) - float(theirs)) < 1e-7:
        fail(f"both schedules give the same lr: {line}")
    print(f"messages: {line.split('WARN ')[1]}")
    # A constant schedule gives the same lr under both: said, not warned.
    const_root = os.path.join(tmp, "msg-constant")
    constant = sets(checkpoint__dir=const_root, optim__schedule__kind="constant")
    run([trainer, "--config", TINY, "--stop-after", "10"] + constant)
    same = run([trainer, "--config", TINY, "--steps", "100", "--stop-after", "11"] + constant)
    out = expect(same, 0, "(train.steps 60 -> 100, constant -> constant): step 11 uses lr 3.000e-03 under both",
                 what="schedule change, same lr")
    if "WARN" in [ln for ln in out.splitlines() if "schedule differs" in ln][0]:
        fail("an unchanged lr was reported as a warning")

    keep = run([trainer, "--config", TINY, "--stop-after", "30", "--steps", "100"] +
               sets(checkpoint__dir=root, checkpoint__keep_last=1))
    expect(keep, 0, "checkpoint.keep_last 1: deleted step-000010, step-000011", "checkpoint.keep_last 1: deleted "
           "step-000020", what="keep_last")
    print("messages: keep_last names each checkpoint it deletes")

    done = run([trainer, "--config", TINY, "--steps", "30"] + sets(checkpoint__dir=root), expect_ok=False)
    expect(done, 1, "is at step 30, the run ends at step 30 (train.steps): this run is finished; its run was set "
           "to end at step 100: --steps 100 continues that schedule", what="finished")
    if "final loss 0.0000" in done.stderr or "0 tokens/s" in done.stderr:
        fail("a finished run printed an empty summary")

    # A run finished by its own schedule: the message gives flags that go on at the rate it ended at
    # (cosine to min_lr 3e-4), and they work: no second rise of the learning rate, not even a warning.
    ended = os.path.join(tmp, "msg-ended")
    run([trainer, "--config", TINY, "--steps", "12"] + sets(checkpoint__dir=ended))
    again = run([trainer, "--config", TINY, "--steps", "12"] + sets(checkpoint__dir=ended), expect_ok=False)
    hint = ("this run is finished; raise train.steps and hold its final learning rate to train further: --steps 24 "
            "--set optim.schedule.kind=constant --set optim.lr=3e-04 (--steps alone stretches the cosine schedule "
            "and the learning rate rises again)")
    expect(again, 1, hint, what="finished by its own schedule")
    flags = hint.split("further: ")[1].split(" (")[0].split()
    going = run([trainer, "--config", TINY] + flags + sets(checkpoint__dir=ended))
    out = expect(going, 0, "(train.steps 12 -> 24, cosine -> constant): step 13 uses lr 3.000e-04 under both",
                 "done: steps 13..24", what="the suggested continuation")
    if any("WARN" in ln for ln in out.splitlines()):
        fail(f"the suggested continuation warned: {[ln for ln in out.splitlines() if 'WARN' in ln]}")
    print(f"messages: a finished run suggests `{' '.join(flags)}`; it runs steps 13..24 at lr 3.000e-04, no warning")

    short = run([trainer, "--config", TINY, "--steps", "1"])
    expect(short, 0, "optim.schedule.warmup_steps 2 is longer than the run (train.steps 1); warming up over all 1 "
                     "steps", "done: steps 1..1", what="--steps 1")
    print("messages: --steps 1 below warmup_steps 2 clamps with a warning and runs")

    sharded = run([trainer, "--config", TINY] + sets(checkpoint__format="sharded") +
                  ["--set", "checkpoint.unified_checkpoint_config=[skip_save_model_weight]"], expect_ok=False)
    expect(sharded, 1, "no skip_save_model_weight with checkpoint.format: sharded", what="skip with sharded")

    quiet = run([trainer, "--config", TINY, "--steps", "3", "--log-level", "warn"])
    lines = [ln for ln in quiet.stderr.splitlines() if ln.strip()]
    if len(lines) != 1 or "done: steps 1..3" not in lines[0]:
        fail(f"--log-level warn should print only the summary line, printed {lines}")
    print(f"messages: --log-level warn prints one line: {lines[0]}")

    toy = run([trainer, "--config", TOY, "--steps", "3"])
    step_lines = [ln for ln in toy.stderr.splitlines() if "step 3/3" in ln]
    if not step_lines or "samples/s" not in step_lines[0] or "tok/s" in step_lines[0]:
        fail(f"the toy step line should give samples/s: {step_lines}")
    expect(toy, 0, "samples/s (all ranks, steps 2..3, MFU ", "per-rank memory: master 1.6 kB", what="toy units")
    print(f"messages: toy: {step_lines[0].split('INFO  ')[1]}")

    resumed = run([trainer, "--config", TINY, "--resume", os.path.join(root, "step-000030"), "--steps", "31"])
    expect(resumed, 0, "read in", "(model weights not read: master weights are)",
           "--resume " + os.path.join(root, "step-000030") + " without checkpoint.dir: this run saves no checkpoints",
           what="resume line")
    if "resolved configuration" in resumed.stderr:
        fail("the resolved configuration printed at info level")
    debug = run([trainer, "--config", TINY, "--steps", "1", "--log-level", "debug"])
    expect(debug, 0, "resolved configuration", "    param_dtype: bf16", what="debug config")
    info_lines = len([ln for ln in resumed.stderr.splitlines() if " INFO " in ln])
    print(f"messages: resume line explains the byte count; config only at debug; {info_lines} info lines")


def check_errors_once(trainer, tmp):
    proc = run(mpirun(4) + [trainer, "--config", TINY, "--set", "fsdp.sharding_stratgy=NO_SHARD"], expect_ok=False)
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "error:" in ln]
    if proc.returncode == 0 or len(errors) != 1 or "unknown key 'fsdp.sharding_stratgy'" not in errors[0]:
        sys.stderr.write(proc.stderr[-3000:])
        fail(f"a bad key at 4 ranks should print one error line, printed {len(errors)}: {errors}")
    print(f"errors-once: 4 ranks, bad key: exit {proc.returncode}, one line: {errors[0]}")
    afile = os.path.join(tmp, "afile")
    open(afile, "w").close()
    proc = run(mpirun(4) + [trainer, "--config", TINY] + sets(checkpoint__dir=os.path.join(afile, "x")),
               expect_ok=False)
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "error:" in ln]
    if proc.returncode == 0 or len(errors) != 1 or "checkpoint.dir" not in errors[0]:
        fail(f"a shared checkpoint.dir error at 4 ranks should print one line, printed {errors}")
    print(f"errors-once: 4 ranks, unusable checkpoint.dir: one line: {errors[0][:120]}")

    # Checkpoint errors every rank reaches alike: a checkpoint that does not fit the model, a finished run.
    # (A save refused for non-finite state, found on one rank and agreed by all, is fault_nonfinite's.)
    ckpt = os.path.join(tmp, "ckpt")
    run(mpirun(4) + [trainer, "--config", TINY, "--steps", "10"] + sets(checkpoint__dir=ckpt))

    def one_error(cmd, want, what, launcher=False):
        proc = run(cmd, expect_ok=False)
        errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "error:" in ln]
        if proc.returncode == 0 or len(errors) != 1 or want not in errors[0]:
            sys.stderr.write(proc.stderr[-3000:])
            fail(f"{what} at 4 ranks should print one error line with '{want}' and exit non-zero; "
                 f"exit {proc.returncode}, {len(errors)} line(s): {errors}")
        print(f"errors-once: 4 ranks, {what}: exit {proc.returncode}, one line: {errors[0][:150]}")

    one_error(mpirun(4) + [trainer, "--config", TINY] + sets(checkpoint__dir=ckpt, model__num_hidden_layers=1),
              "does not fit this run", "a 2-layer checkpoint into a 1-layer model")
    one_error(mpirun(4) + [trainer, "--config", TINY, "--steps", "10"] + sets(checkpoint__dir=ckpt),
              "this run is finished", "a finished run")
    # Through scripts/launch, whose long odls_base_sigkill_timeout must not keep a failed job waiting: the
    # bound is a hang check (mpirun would otherwise wait 2 x 120 s), far above the seconds a failure takes.
    launch = [os.path.join(ROOT, "scripts", "launch"), "-np", "4"]
    t0 = time.time()
    one_error(launch + [trainer, "--config", TINY] + sets(fsdp__sharding_stratgy="NO_SHARD"),
              "unknown key 'fsdp.sharding_stratgy'", "a bad key through scripts/launch")
    if time.time() - t0 > 60:
        fail(f"scripts/launch took {time.time() - t0:.0f} s to end a failed job")


def check_relative_dir(trainer, tmp):
    work = os.path.join(tmp, "work")
    os.makedirs(work)
    rel = os.path.join("runs", "toy")
    absolute = os.path.join(work, rel)
    toy = os.path.join(ROOT, TOY)

    def in_work(*args):
        return subprocess.run([trainer, "--config", toy] + list(args), cwd=work, capture_output=True, text=True)

    first = in_work("--steps", "2", *sets(checkpoint__dir=rel))
    expect(first, 0, f"--resume auto: no step directory in {rel} ({absolute}); starting from step 0",
           what="relative checkpoint.dir, fresh start")
    again = in_work("--steps", "4", *sets(checkpoint__dir=rel))
    step = os.path.join(rel, "step-000002")
    expect(again, 0, f"resumed from {step} ({os.path.join(absolute, 'step-000002')})", what="relative resume")
    with open(os.path.join(work, "file"), "w") as f:
        f.write("not a directory")
    bad = in_work("--steps", "2", *sets(checkpoint__dir="file/ckpt"))
    expect(bad, 1, f"checkpoint.dir 'file/ckpt' ({os.path.join(work, 'file', 'ckpt')}) cannot be created",
           what="relative checkpoint.dir under a file")
    print(f"relative-dir: fresh start, resume and probe name {rel} as {absolute}")


def main():
    check_main({"overwrite": check_overwrite, "messages": check_messages, "errors-once": check_errors_once,
                "relative-dir": check_relative_dir})


if __name__ == "__main__":
    main()
