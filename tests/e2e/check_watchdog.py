#!/usr/bin/env python3
"""The collective watchdog end to end (standard library only).

    check_watchdog.py TRAINER CHECK

CHECK is one of:
  stop-rank   llama-tiny at 4 ranks with comm.timeout_s 5; `kill -STOP` of rank 2
              after a few steps: the job exits non-zero within 30 s of the stop,
              and rank 0's one line names the collective, the unit and rank 2 as
              the rank that has not arrived (no heartbeat).
  stop-root   the same with rank 0 stopped: the other ranks name their collective
              and say rank 0 has stopped answering.
  no-alarm    a normal 4-rank run with comm.timeout_s 5 finishes with exit 0 and no
              watchdog line.
  stop-save   llama-tiny at 2 ranks with comm.timeout_s 5 saving at step 2; rank 1
              stops inside the save, after writing its files (the test hook
              ST_TEST_PAUSE_AT=files_written@2, core/test_hook.h): the job exits
              non-zero and rank 0's line says it waited during the checkpoint save
              of step 2 (its finishing phase), not during the last unit's backward,
              and that rank 1 is in the same save, writing its files (its heartbeat
              carries its phase).
Each check prints what it observed; a failure exits 1.
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, check_main, fail, mpirun, rank_pids  # noqa: E402

TINY = "configs/llama-tiny.yaml"


def run_and_stop(trainer, tmp, victim, launcher=None):
    metrics = os.path.join(tmp, f"stop-{victim}.jsonl")
    cmd = (launcher or mpirun(4)) + [trainer, "--config", TINY, "--steps", "1000000", "--set", "comm.timeout_s=5",
                       "--set", "logging.interval=1000", "--set", f"logging.metrics_file={metrics}",
                       "--set", "logging.interval=1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and (not os.path.exists(metrics) or len(open(metrics).readlines()) < 5):
        time.sleep(0.1)
    pids = rank_pids(metrics)
    if len(pids) != 4:
        proc.kill()
        fail(f"expected 4 ranks, found {pids}")
    os.kill(pids[victim], signal.SIGSTOP)
    t0 = time.time()
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        for pid in pids.values():  # nothing may outlive the test, stopped or not
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
    return proc.returncode, out + err, time.time() - t0


def watchdog_lines(text):
    return [ln for ln in text.splitlines() if "watchdog" in ln and "ERROR" in ln]


def check_stop_rank(trainer, tmp, launcher=None):
    code, text, secs = run_and_stop(trainer, tmp, 2, launcher)
    lines = watchdog_lines(text)
    root = [ln for ln in lines if ln.startswith("[0/4]")]
    print(f"stop-rank{' (scripts/launch)' if launcher else ''}: exit {code} {secs:.1f} s after SIGSTOP of rank 2")
    for ln in lines:
        print(f"  {ln[:300]}")
    want = ("made no progress for", "of unit", "ranks that have not arrived: 2 (no heartbeat")
    if code == 0 or secs > 30 or not root or not all(w in root[0] for w in want) or \
            not any(op in root[0] for op in ("all_gather", "reduce_scatter", "all_reduce")):
        sys.stderr.write(text[-3000:])
        fail("the job did not abort within 30 s naming the collective, the unit and rank 2")


def check_stop_root(trainer, tmp):
    code, text, secs = run_and_stop(trainer, tmp, 0)
    # Rank 0 itself is woken (SIGCONT) by mpirun's kill path before it dies; only the others judge.
    lines = [ln for ln in watchdog_lines(text) if not ln.startswith("[0/4]")]
    print(f"stop-root: exit {code} {secs:.1f} s after SIGSTOP of rank 0")
    for ln in lines[:2]:
        print(f"  {ln[:300]}")
    if code == 0 or secs > 30 or not lines or not all("rank 0 has not answered" in ln for ln in lines) or \
            not any(op in lines[0] for op in ("all_gather", "reduce_scatter", "all_reduce")):
        sys.stderr.write(text[-3000:])
        fail("with rank 0 stopped, the job did not abort within 30 s naming the collective and rank 0")


def check_no_alarm(trainer, tmp):
    proc = subprocess.run(mpirun(4) + [trainer, "--config", TINY, "--set", "comm.timeout_s=5"], cwd=ROOT,
                          capture_output=True, text=True)
    print(f"no-alarm: exit {proc.returncode}, watchdog lines: {len(watchdog_lines(proc.stderr))}")
    if proc.returncode != 0 or watchdog_lines(proc.stderr) or "done: steps 1..60" not in proc.stderr:
        sys.stderr.write(proc.stderr[-3000:])
        fail("a healthy run with comm.timeout_s 5 did not finish cleanly")


def check_stop_save(trainer, tmp):
    args = [trainer, "--config", TINY, "--steps", "4", "--set", "comm.timeout_s=5", "--set",
            f"checkpoint.dir={os.path.join(tmp, 'ckpt')}", "--set", "checkpoint.interval=2"]
    # Two app contexts: only rank 1 carries the hook (the paused rank waits until mpirun kills it).
    cmd = mpirun(1) + args + [":", "-np", "1", "env", "ST_TEST_PAUSE_AT=files_written@2"] + args
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    text = proc.stdout + proc.stderr
    root = [ln for ln in watchdog_lines(text) if ln.startswith("[0/2]")]
    print(f"stop-save: exit {proc.returncode}")
    for ln in root:
        print(f"  {ln[:400]}")
    want = ("made no progress for", "during the checkpoint save of step 2 (finishing: checksums, indexes, commit)",
            "still computing: 1 (not waiting: computing for",
            "during the checkpoint save of step 2 (writing this rank's files))")
    if proc.returncode == 0 or "test hook: paused at files_written of step 2" not in text or not root or \
            not all(w in root[0] for w in want) or "of unit" in root[0]:
        sys.stderr.write(text[-3000:])
        fail(f"rank 0's watchdog line does not name the save of step 2: expected {want}")


def main():
    # Through scripts/launch too: its long odls_base_sigkill_timeout must not hold the aborted job.
    launched = [os.path.join(ROOT, "scripts", "launch"), "-np", "4"]
    check_main({"stop-rank": check_stop_rank, "stop-root": check_stop_root, "no-alarm": check_no_alarm,
                "stop-save": check_stop_save,
                "stop-rank-launch": lambda t, d: check_stop_rank(t, d, launched)})


if __name__ == "__main__":
    main()
