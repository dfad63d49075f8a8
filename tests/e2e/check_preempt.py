#!/usr/bin/env python3
"""Preemption through the launcher (standard library only).

    check_preempt.py TRAINER CHECK

A small LLaMA with 4 micro-batches per rank at 2 ranks runs through
scripts/launch, i.e. under mpirun. The test hook ST_TEST_HOLD_MICRO_BATCH=S
holds step S after its first micro-batch until a stop signal arrives, and the
signal is sent when the run says it is held there: never after a delay. CHECK is
one of:
  term   `kill -TERM <launcher pid>` in the middle of step 3, as a scheduler does:
         every rank stops at the next micro-batch boundary, the last completed
         step is committed as a checkpoint, and the launcher exits 0. Resuming
         from it gives the next step's loss bit-identical to an uninterrupted run.
  int    the same with SIGINT (Ctrl-C), and with no checkpoint to write the run
         still exits 0 and says nothing was saved.
  first-step  SIGTERM in the first step of a process (held after micro-batch 1), fresh and
         resumed: exit 0 (no segfault reading the last loss of none), the stopped line says no
         step completed and nothing was saved, `latest` still names the step resumed from.
  start-up    SIGTERM while a rank is held in start-up before MPI starts (the hook
         ST_TEST_HOLD_FOR_STOP=start-up), and SIGTERM as soon as the run prints its first line:
         no rank is killed by the relayed SIGUSR1, exit 0, the last lines name SIGTERM.
  save-sync   SIGTERM while the interval save of step 2 is written (ST_TEST_HOLD_FOR_STOP=save@2
         holds the ranks there until the signal arrives): that save is the stop's; the run ends
         after it, no step 3, no second save, exit 0.
  save-async  the same with checkpoint.async; and a stop at the end of the step during which the
         async save of the step before was written (step-end@3): that save is the stop's, step 3
         is not saved, and the stopped line says so.
Each check prints what it observed; a failure exits 1.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, check_main, fail, loss_by_step  # noqa: E402

LAUNCH = os.path.join(ROOT, "scripts", "launch")
# 4 micro-batches per rank at 2 ranks, so a step has boundaries inside it where a stop can land.
RUN = ["--config", "configs/llama-tiny.yaml", "--steps", "100000"]
for kv in ("train.global_batch_size=8", "train.micro_batch_size=1", "fsdp.mixed_precision.param_dtype=f32",
           "optim.schedule.warmup_steps=0", "logging.interval=1"):
    RUN += ["--set", kv]


def start(trainer, extra, metrics, hold_step, hold_for_stop=None):
    """The launcher, with step hold_step held after its first micro-batch until a stop signal arrives (or,
    with hold_for_stop, the ST_TEST_HOLD_FOR_STOP point it names)."""
    cmd = [LAUNCH, "-np", "2", trainer] + RUN + ["--set", f"logging.metrics_file={metrics}"] + extra
    env = dict(os.environ, ST_TEST_HOLD_MICRO_BATCH=str(hold_step))
    if hold_for_stop:
        env["ST_TEST_HOLD_FOR_STOP"] = hold_for_stop
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def interrupt_mid_step(proc, sig, hold_step):
    """Sends `sig` to the launcher once step hold_step is held between micro-batches 1 and 2 (the test
    hook says so on stderr), so the signal is known to land inside that step however busy the machine is."""
    return signal_on_line(proc, sig, f"test hook: holding step {hold_step} after micro-batch 1")


def signal_on_line(proc, sig, want):
    """Sends `sig` to the launcher once its stderr has shown a line holding `want`; returns (stdout,
    stderr, seconds from the signal to the launcher's end)."""
    seen = []
    for line in proc.stderr:  # ends at EOF if the run dies first; the test's timeout guards a hang
        seen.append(line)
        if want in line:
            break
    else:
        proc.wait()
        fail(f"the run ended (exit {proc.returncode}) before it printed '{want}': {''.join(seen)[-2000:]}")
    t0 = time.time()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return out, "".join(seen) + err, time.time() - t0


def check_term(trainer, tmp):
    root = os.path.join(tmp, "ckpt")
    metrics = os.path.join(tmp, "run.jsonl")
    proc = start(trainer, ["--set", f"checkpoint.dir={root}", "--set", "checkpoint.interval=0"], metrics, 3)
    out, err, secs = interrupt_mid_step(proc, signal.SIGTERM, 3)
    logged = loss_by_step(metrics)
    k = max(logged)
    with open(os.path.join(root, "latest")) as f:
        latest = f.read().strip()
    ok = (proc.returncode == 0 and k == 2 and f"stopped after step {k} of 100000 (SIGTERM)" in err and
          f"stopping in step {k + 1} at a micro-batch boundary" in err and latest == f"step-{k:06d}" and
          os.path.exists(os.path.join(root, latest, "COMPLETE")))
    print(f"term: launcher exit {proc.returncode} {secs:.1f} s after SIGTERM; stopped in step {k + 1}, "
          f"latest = {latest}")
    if not ok:
        sys.stderr.write(err[-3000:])
        fail("SIGTERM to the launcher did not end in a committed checkpoint of the last step and exit 0")
    # Resumed, step k+1 equals the uninterrupted run's step k+1 bit for bit.
    resumed_metrics = os.path.join(tmp, "resumed.jsonl")
    resumed = subprocess.run([LAUNCH, "-np", "2", trainer] + RUN +
                             ["--set", f"checkpoint.dir={root}", "--set", f"logging.metrics_file={resumed_metrics}",
                              "--stop-after", str(k + 1)], cwd=ROOT, capture_output=True, text=True)
    full_metrics = os.path.join(tmp, "full.jsonl")
    full = subprocess.run([LAUNCH, "-np", "2", trainer] + RUN +
                          ["--set", f"logging.metrics_file={full_metrics}", "--stop-after", str(k + 1)],
                          cwd=ROOT, capture_output=True, text=True)
    if resumed.returncode != 0 or full.returncode != 0:
        fail(f"resume or reference run failed: {resumed.stderr[-1500:]} {full.stderr[-1500:]}")
    a, b = loss_by_step(resumed_metrics), loss_by_step(full_metrics)
    print(f"term: step {k + 1} after the restart {a[k + 1]!r}, uninterrupted {b[k + 1]!r}")
    if a[k + 1] != b[k + 1] or a.keys() != {k + 1}:
        fail("the resumed run differs from the uninterrupted one")


def check_int(trainer, tmp):
    root = os.path.join(tmp, "ckpt")
    metrics = os.path.join(tmp, "run.jsonl")
    proc = start(trainer, ["--set", f"checkpoint.dir={root}", "--set", "checkpoint.interval=0"], metrics, 2)
    out, err, secs = interrupt_mid_step(proc, signal.SIGINT, 2)
    k = max(loss_by_step(metrics))
    with open(os.path.join(root, "latest")) as f:
        latest = f.read().strip()
    print(f"int: launcher exit {proc.returncode} {secs:.1f} s after SIGINT; latest = {latest}")
    if proc.returncode != 0 or k != 1 or latest != f"step-{k:06d}" or "stopping in step 2 at a micro-batch" not in err \
            or f"stopped after step {k} of 100000 (SIGINT)" not in err:
        sys.stderr.write(err[-3000:])
        fail("SIGINT to the launcher did not end in a committed checkpoint and exit 0")
    os.remove(metrics)
    proc = start(trainer, [], metrics, 2)
    out, err, secs = interrupt_mid_step(proc, signal.SIGINT, 2)
    print(f"int: without checkpoint.dir: exit {proc.returncode}, "
          f"{'says nothing was saved' if 'nothing was saved' in err else 'SILENT'}")
    if proc.returncode != 0 or "no checkpoint.dir, so nothing was saved" not in err:
        fail("SIGINT without checkpoint.dir should exit 0 and say nothing was saved")


def latest_step(root):
    """The step `latest` names under root, or None without one."""
    try:
        with open(os.path.join(root, "latest")) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def step_dirs(root):
    return sorted(d for d in os.listdir(root) if d.startswith("step-")) if os.path.isdir(root) else []


def expect_clean_stop(proc, err, what, *texts):
    """Fails unless the launcher exited 0, no rank was killed and stderr holds every text."""
    missing = [t for t in texts if t not in err]
    if proc.returncode != 0 or missing or "killed by" in err:
        sys.stderr.write(err[-3000:])
        fail(f"{what}: exit {proc.returncode} (expected 0); missing from the output: {missing}")


def check_first_step(trainer, tmp):
    metrics = os.path.join(tmp, "first.jsonl")
    proc = start(trainer, [], metrics, 1)
    out, err, secs = interrupt_mid_step(proc, signal.SIGTERM, 1)
    print(f"first-step: fresh run stopped in step 1: exit {proc.returncode}: "
          f"{next((ln for ln in err.splitlines() if 'done:' in ln), '(no done line)').strip()}")
    expect_clean_stop(proc, err, "SIGTERM in the first step of a fresh run",
                      "stopping in step 1 at a micro-batch boundary",
                      "stopped after step 0 of 100000 (SIGTERM); no step completed in this run, so nothing was saved\n",
                      "done: no step completed (stopped by SIGTERM in step 1), on cpu")
    root = os.path.join(tmp, "ckpt")
    first = subprocess.run([LAUNCH, "-np", "2", trainer] + RUN + ["--set", f"checkpoint.dir={root}", "--stop-after", "2"],
                           cwd=ROOT, capture_output=True, text=True)
    if first.returncode != 0 or latest_step(root) != "step-000002":
        fail(f"the run to resume from failed: {first.stderr[-2000:]}")
    proc = start(trainer, ["--set", f"checkpoint.dir={root}"], metrics, 3)
    out, err, secs = interrupt_mid_step(proc, signal.SIGTERM, 3)
    print(f"first-step: resumed at step 2, stopped in step 3: exit {proc.returncode}, latest = {latest_step(root)}")
    expect_clean_stop(proc, err, "SIGTERM in the first step of a resumed run",
                      "stopped after step 2 of 100000 (SIGTERM); no step completed in this run, so nothing was saved "
                      "(step 2, where it resumed, stays the latest checkpoint)",
                      "done: no step completed (stopped by SIGTERM in step 3), on cpu")
    if latest_step(root) != "step-000002" or step_dirs(root) != ["step-000002"]:
        fail(f"the resumed checkpoint should stay latest and alone: {latest_step(root)}, {step_dirs(root)}")


def check_start_up(trainer, tmp):
    root = os.path.join(tmp, "ckpt")
    metrics = os.path.join(tmp, "start.jsonl")
    # Held before MPI starts: every rank waits there for its stop signal.
    proc = start(trainer, ["--set", f"checkpoint.dir={root}"], metrics, 0, "start-up")
    out, err, secs = signal_on_line(proc, signal.SIGTERM, "test hook: holding at start-up until a stop signal arrives")
    print(f"start-up: SIGTERM before MPI starts: exit {proc.returncode}: "
          f"{next((ln for ln in err.splitlines() if 'stopped after' in ln), '(no stopped line)').strip()}")
    expect_clean_stop(proc, err, "SIGTERM during start-up",
                      "stopped after step 0 of 100000 (SIGTERM); the stop came during start-up, so no step ran and "
                      "nothing was saved", "done: no step completed (stopped by SIGTERM during start-up), on cpu")
    if step_dirs(root) or os.path.exists(metrics) and loss_by_step(metrics):
        fail(f"a stop during start-up should train and save nothing: {step_dirs(root)}")
    # Signalled on the run's first line, i.e. somewhere in start-up after MPI started (or, on a fast machine,
    # later): wherever it lands, a clean stop naming SIGTERM.
    proc = start(trainer, [], os.path.join(tmp, "first-line.jsonl"), 0)
    out, err, secs = signal_on_line(proc, signal.SIGTERM, "shardtrain: config")
    line = next((ln for ln in err.splitlines() if "stopped after" in ln), "(no stopped line)").strip()
    print(f"start-up: SIGTERM on the first line: exit {proc.returncode}: {line}")
    expect_clean_stop(proc, err, "SIGTERM on the first line", " of 100000 (SIGTERM)", "done: ")


def stop_at_hold(trainer, ckpt, metrics, root, hold, line, what):
    """Starts one rank held at `hold` (ST_TEST_HOLD_FOR_STOP), sends SIGTERM on the hook's `line`
    and returns (proc, stderr, the steps in the metrics file, the count of saves), printing them."""
    proc = start(trainer, ckpt, metrics, 0, hold)
    _, err, _ = signal_on_line(proc, signal.SIGTERM, line)
    steps = sorted(loss_by_step(metrics))
    saves = err.count("saved checkpoint")
    print(f"{what}: exit {proc.returncode}, steps {steps}, {saves} save(s), checkpoints {step_dirs(root)}")
    return proc, err, steps, saves


def check_save(trainer, tmp, asynchronous):
    name = "save-async" if asynchronous else "save-sync"
    root = os.path.join(tmp, "ckpt")
    metrics = os.path.join(tmp, "save.jsonl")
    # One micro-batch per rank: a step has no boundary inside it where a stop would end it early.
    ckpt = ["--set", f"checkpoint.dir={root}", "--set", "checkpoint.interval=2", "--set",
            f"checkpoint.async={'true' if asynchronous else 'false'}", "--set", "train.global_batch_size=2"]
    proc, err, steps, saves = stop_at_hold(trainer, ckpt, metrics, root, "save@2",
                                           "test hook: holding at save@2 until a stop signal arrives",
                                           f"{name}: SIGTERM during the save of step 2")
    expect_clean_stop(proc, err, f"{name}: SIGTERM during a save", "stopped after step 2 of 100000 (SIGTERM)\n")
    if steps != [1, 2] or saves != 1 or step_dirs(root) != ["step-000002"] or latest_step(root) != "step-000002" \
            or "stopping in step 3" in err:
        fail("a stop during a save should end the run after that save: no further step, no second save")
    if not asynchronous:
        return
    # The stop lands at the end of step 3, while (or just after) the async save of step 2 was written.
    shutil.rmtree(root)
    os.remove(metrics)
    proc, err, steps, saves = stop_at_hold(trainer, ckpt, metrics, root, "step-end@3",
                                           "test hook: holding at step-end@3 until a stop signal",
                                           f"{name}: SIGTERM at the end of step 3, after the async save of step 2")
    expect_clean_stop(proc, err, f"{name}: SIGTERM after an async save",
                      "stopped after step 3 of 100000 (SIGTERM); the checkpoint of step 2, written in the background "
                      "when the stop came, is the last: step 3 was not saved (a resumed run redoes it)")
    if steps != [1, 2, 3] or saves != 1 or step_dirs(root) != ["step-000002"] or latest_step(root) != "step-000002":
        fail("a stop while an async save is written should end the run with that save, not a second one")


def main():
    check_main({"term": check_term, "int": check_int, "first-step": check_first_step, "start-up": check_start_up,
                "save-sync": lambda t, tmp: check_save(t, tmp, False),
                "save-async": lambda t, tmp: check_save(t, tmp, True)})


if __name__ == "__main__":
    main()
