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
Each check prints what it observed; a failure exits 1.
"""
import os
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


def start(trainer, extra, metrics, hold_step):
    """The launcher, with step hold_step held after its first micro-batch until a stop signal arrives."""
    cmd = [LAUNCH, "-np", "2", trainer] + RUN + ["--set", f"logging.metrics_file={metrics}"] + extra
    env = dict(os.environ, ST_TEST_HOLD_MICRO_BATCH=str(hold_step))
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def interrupt_mid_step(proc, sig, hold_step):
    """Sends `sig` to the launcher once step hold_step is held between micro-batches 1 and 2 (the test
    hook says so on stderr), so the signal is known to land inside that step however busy the machine is."""
    want = f"test hook: holding step {hold_step} after micro-batch 1"
    seen = []
    for line in proc.stderr:  # ends at EOF if the run dies first; the test's timeout guards a hang
        seen.append(line)
        if want in line:
            break
    else:
        proc.wait()
        fail(f"the run ended (exit {proc.returncode}) before step {hold_step} was held: {''.join(seen)[-2000:]}")
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


def main():
    check_main({"term": check_term, "int": check_int})


if __name__ == "__main__":
    main()
