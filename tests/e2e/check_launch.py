#!/usr/bin/env python3
"""scripts/launch's failure handling, and environments that would split a job (standard library only).

    check_launch.py TRAINER CHECK

Every signal below is sent once the program has said it reached the phase to hit (a metrics line, a log
line, the test hook ST_TEST_HOLD_STOP_SAVE), never after a delay; timeouts are hang guards only. CHECK is
one of:
  rank-killed      `kill -KILL` of rank 1 of 2 while training: the job ends (mpirun alone would wait
                   2 x 120 s), the launcher exits 137 naming rank 1, its pid and "killed by SIGKILL — out of
                   memory?", and no process of the job is left.
  second-signal    SIGTERM to the launcher, and a second SIGTERM while the ranks hold at the start of the
                   stop's save: the ranks save, the checkpoint is committed, the launcher exits 0.
  launcher-killed  `kill -9` of the launcher while training: mpirun and every rank end (checked by pid),
                   having saved the last step; the checkpoint.dir lock is free and the job's last lines
                   still reach the launcher's stderr.
  agent-killed     `kill -9` of rank 1's agent (scripts/launch-rank) while training: the launcher names it and its
                   rank in one line and exits 1 (it used to wait, silent, while rank 0 spun), and no process of the
                   job is left; again with a SIGTERM to the launcher right after the kill.
  mpirun-signalled SIGTERM to mpirun itself (not to the launcher): the launcher says mpirun does not pass it on and
                   how to stop a job; the ranks save and stop at once (mpirun would SIGTERM them 120 s later) and
                   the launcher exits 0, repeating rank 0's stopped line, which mpirun holds back.
  clean            good runs through the launcher exit 0 and print no line about /proc, from bash or from the
                   launcher.
  quiet-failure    a typo in --set through the launcher prints the rank's one error line and nothing else (no
                   mpirun banner, no launcher line), exit 1; with --verbose the launcher's line too. A program that
                   does not exist (mpirun fails, saying nothing under -q): one launcher line pointing to --verbose.
  sigint-ignored   a launcher started with SIGINT ignored (as `cmd &` in a script does) says so at start with its
                   pid; SIGINT leaves the run going; SIGTERM then stops it, the last line naming SIGTERM.
  signal-names     SIGUSR1 and SIGHUP to the launcher: the trainer's last line names the signal received.
  late-signal      a stop's SIGUSR1 arriving again at a rank that has already stopped (sent once its handler is
                   gone; each rank's launch-rank passes a stop on at its own moment): the rank still exits 0.
  errors-once      errors every rank hits, at 2-3 ranks: batch sizes that do not divide (with what would),
                   train.device: cuda without a GPU, a missing --config (--self-check alone) print one line; --help
                   and --print-config print once.
  split            RANK=1 WORLD_SIZE=2, or SLURM_NTASKS=2 SLURM_PROCID=0, without an MPI world: the trainer
                   exits 1 before doing anything, saying to launch through mpirun/srun; RANK=0 WORLD_SIZE=1
                   still runs.
Each check prints what it observed; a failure exits 1.
"""
import fcntl
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, check_main, fail, metrics_rows, rank_pids  # noqa: E402

LAUNCH = os.path.join(ROOT, "scripts", "launch")
TINY = ["--config", "configs/llama-tiny.yaml", "--steps", "1000000", "--set", "logging.interval=1"]
HANG_S = 240  # a hang guard: far above what any of these takes


# Lines no run may print: bash's own errors and job notices ("scripts/launch: line 74: /proc/30759/stat: No such
# file or directory", "launch-rank: line 100: 4242 Killed ..."), a /proc path, and mpirun's banners.
NOISE = re.compile(r"launch(-rank)?: line \d+: |/proc/|Primary job|mpirun detected|mpirun noticed|Forwarding signal|"
                   r"^-{20,}$")


def noise(text):
    return [ln for ln in text.splitlines() if NOISE.search(ln)]


def sigint_default():
    """preexec_fn: SIGINT at its default, so the launcher's warning for an ignored SIGINT does not depend on how
    the test itself was started (CTest in the background of a script would pass SIGINT ignored on)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sigint_ignored():
    """preexec_fn: SIGINT ignored, as a shell starts a background job."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Job:
    """A command whose stderr is read as it comes, so a test can wait for a line."""

    def __init__(self, cmd, env=None, preexec=sigint_default):
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, preexec_fn=preexec)
        self.err, self.out = [], []
        self.cond = threading.Condition()
        self.readers = [threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
                        threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True)]
        for r in self.readers:
            r.start()

    def _read(self, stream, lines):
        for line in stream:
            with self.cond:
                lines.append(line)
                self.cond.notify_all()

    def wait_for_line(self, text):
        """The first stderr line holding `text`; fails if the job ends or hangs first."""
        deadline = time.time() + HANG_S
        with self.cond:
            while True:
                hit = next((ln for ln in self.err if text in ln), None)
                if hit is not None:
                    return hit
                if self.proc.poll() is not None and not any(r.is_alive() for r in self.readers):
                    self.dump()
                    fail(f"the job ended (exit {self.proc.returncode}) before it printed '{text}'")
                if time.time() > deadline:
                    self.proc.kill()
                    fail(f"no '{text}' within {HANG_S} s (hang guard)")
                self.cond.wait(0.5)

    def finish(self):
        """Waits for the launcher and for its output to end (every writer gone); returns stderr."""
        try:
            self.proc.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail(f"the launcher did not end within {HANG_S} s (hang guard)")
        for r in self.readers:
            r.join(HANG_S)
        return "".join(self.err)

    def dump(self):
        sys.stderr.write("".join(self.err)[-4000:])


def wait_for_steps(metrics, n, job):
    """Waits until the run has logged n steps to its metrics file."""
    deadline = time.time() + HANG_S
    while time.time() < deadline and job.proc.poll() is None:
        if os.path.exists(metrics):
            with open(metrics) as f:
                if len(f.readlines()) >= n:
                    return
        time.sleep(0.05)
    job.dump()
    fail(f"the run did not log {n} steps (exit {job.proc.poll()})")


def alive(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids, what):
    """Waits until none of `pids` runs; fails (killing them) if they outlive the hang guard."""
    deadline = time.time() + HANG_S
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    if left:
        fail(f"{what}: processes {left} still ran {HANG_S} s later")


def children(pid, comm):
    """The pids of `pid`'s children named `comm`."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if stat.split(" (", 1)[1].rsplit(")", 1)[0] == comm and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(name))
    return out


def parent(pid):
    """The parent pid of `pid`."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def latest_committed(root):
    with open(os.path.join(root, "latest")) as f:
        latest = f.read().strip()
    return latest, os.path.exists(os.path.join(root, latest, "COMPLETE"))


def check_rank_killed(trainer, tmp):
    metrics = os.path.join(tmp, "killed.jsonl")
    job = Job([LAUNCH, "-np", "2", trainer] + TINY + ["--set", f"logging.metrics_file={metrics}"])
    wait_for_steps(metrics, 3, job)
    pids = rank_pids(metrics)
    if sorted(pids) != [0, 1]:
        job.proc.kill()
        fail(f"expected ranks 0 and 1, found {pids}")
    os.kill(pids[1], signal.SIGKILL)
    err = job.finish()
    want = f"launch: rank 1 (pid {pids[1]} on host "
    line = next((ln for ln in err.splitlines() if want in ln), "")
    print(f"rank-killed: launcher exit {job.proc.returncode}: {line}")
    said = [ln for ln in err.splitlines() if ln.startswith("launch")]
    if job.proc.returncode != 137 or "was killed by SIGKILL — out of memory?" not in line or \
            "Ending the other ranks and mpirun, exit 137." not in line or len(said) != 1 or noise(err):
        job.dump()
        fail("SIGKILL of a rank should end the job with exit 137 and one line naming rank 1, its pid and the "
             f"signal, without bash's notices or mpirun's banners: {said + noise(err)}")
    wait_gone(list(pids.values()), "after the launcher ended")
    print(f"rank-killed: ranks {sorted(pids.values())} are gone")


def check_second_signal(trainer, tmp):
    root = os.path.join(tmp, "ckpt")
    metrics = os.path.join(tmp, "second.jsonl")
    release = os.path.join(tmp, "release")
    env = dict(os.environ, ST_TEST_HOLD_STOP_SAVE=release)
    job = Job([LAUNCH, "-np", "2", trainer] + TINY +
              ["--set", f"logging.metrics_file={metrics}", "--set", f"checkpoint.dir={root}",
               "--set", "checkpoint.interval=0"], env)
    wait_for_steps(metrics, 2, job)
    job.proc.send_signal(signal.SIGTERM)
    held = job.wait_for_line("test hook: holding the stop's save of step")
    job.proc.send_signal(signal.SIGTERM)  # during the save
    job.wait_for_line("launch: SIGTERM again")
    open(release, "w").close()
    err = job.finish()
    step = int(held.split("save of step ")[1].split()[0])
    latest, complete = latest_committed(root)
    print(f"second-signal: held at step {step}; launcher exit {job.proc.returncode}; latest = {latest}, "
          f"{'complete' if complete else 'INCOMPLETE'}")
    for ln in err.splitlines():
        if ln.startswith("launch:") or "stopped after" in ln:
            print(f"  {ln.strip()}")
    if job.proc.returncode != 0 or latest != f"step-{step:06d}" or not complete or \
            f"stopped after step {step} of 1000000 (SIGTERM)" not in err:
        job.dump()
        fail("a second SIGTERM during the save should still commit the checkpoint and exit 0")


def saving_job(trainer, tmp, name):
    """A 2-rank llama-tiny job under the launcher that saves only at its end, past its third
    step: (job, checkpoint root, {rank: pid}, [mpirun pid])."""
    root = os.path.join(tmp, "ckpt")
    metrics = os.path.join(tmp, f"{name}.jsonl")
    job = Job([LAUNCH, "-np", "2", trainer] + TINY +
              ["--set", f"logging.metrics_file={metrics}", "--set", f"checkpoint.dir={root}",
               "--set", "checkpoint.interval=0"])
    wait_for_steps(metrics, 3, job)
    return job, root, rank_pids(metrics), children(job.proc.pid, "mpirun")


def check_launcher_killed(trainer, tmp):
    job, root, ranks, mpirun = saving_job(trainer, tmp, "orphan")
    if sorted(ranks) != [0, 1] or len(mpirun) != 1:
        job.proc.kill()
        fail(f"expected ranks 0 and 1 under one mpirun, found {ranks} and {mpirun}")
    job.proc.send_signal(signal.SIGKILL)
    wait_gone(list(ranks.values()) + mpirun, "after kill -9 of the launcher")
    err = job.finish()
    latest, complete = latest_committed(root)
    with open(os.path.join(root, ".lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock = "free"
        except OSError:
            lock = "STILL HELD"
    said = next((ln.strip() for ln in err.splitlines() if "launch-rank:" in ln), "")
    print(f"launcher-killed: mpirun {mpirun} and ranks {sorted(ranks.values())} gone; latest = {latest} "
          f"({'complete' if complete else 'INCOMPLETE'}); lock {lock}")
    print(f"  {said}")
    k = int(latest.split("-")[1]) if latest.startswith("step-") else -1
    if f"launch-rank: scripts/launch (pid {job.proc.pid}) has died" not in said or not complete or \
            lock != "free" or f"stopped after step {k} of 1000000 (SIGUSR1)" not in err:
        job.dump()
        fail("after kill -9 of the launcher the ranks should save, stop and free the lock, saying why")


def check_agent_killed(trainer, tmp):
    for then_term in (False, True):
        metrics = os.path.join(tmp, f"agent-{then_term}.jsonl")
        job = Job([LAUNCH, "-np", "2", trainer] + TINY + ["--set", f"logging.metrics_file={metrics}"])
        wait_for_steps(metrics, 3, job)
        ranks = rank_pids(metrics)
        mpirun = children(job.proc.pid, "mpirun")
        agents = {r: parent(p) for r, p in ranks.items()}  # each rank's scripts/launch-rank
        if sorted(ranks) != [0, 1] or len(mpirun) != 1 or {parent(a) for a in agents.values()} != set(mpirun):
            job.proc.kill()
            fail(f"expected ranks 0 and 1 under launch-rank agents of one mpirun: {ranks}, {agents}, {mpirun}")
        os.kill(agents[1], signal.SIGKILL)
        if then_term:
            job.proc.send_signal(signal.SIGTERM)
        err = job.finish()
        want = re.compile(rf"^launch: scripts/launch-rank of rank 1 \(pid {agents[1]} on host \S+\) died without "
                          rf"reporting how its rank ended \(killed from outside: kill -9\?\); rank 1 \(pid {ranks[1]}\) "
                          r"(is gone with it|was still running; killed)\. Ending the other ranks and mpirun, exit 1\.$", re.M)
        line = next((ln for ln in err.splitlines() if "launch-rank of rank" in ln), "(no line)")
        print(f"agent-killed{' then SIGTERM' if then_term else ''}: launcher exit {job.proc.returncode}: {line}")
        if job.proc.returncode != 1 or not want.search(err) or noise(err):
            job.dump()
            fail("SIGKILL of a rank's agent should end the job with exit 1 and a line naming the agent and its rank")
        wait_gone(list(ranks.values()) + list(agents.values()) + mpirun, "after the launcher ended")


def check_mpirun_signalled(trainer, tmp):
    job, root, ranks, mpirun = saving_job(trainer, tmp, "mpirun")
    if len(mpirun) != 1:
        job.proc.kill()
        fail(f"expected one mpirun under the launcher, found {mpirun}")
    os.kill(mpirun[0], signal.SIGTERM)
    err = job.finish()
    latest, complete = latest_committed(root)
    said = [ln.strip() for ln in err.splitlines() if ln.startswith("launch:")]
    print(f"mpirun-signalled: launcher exit {job.proc.returncode}; latest = {latest} "
          f"({'complete' if complete else 'INCOMPLETE'})")
    for ln in said:
        print(f"  {ln}")
    k = int(latest.split("-")[1]) if latest.startswith("step-") else -1
    want = (f"launch: mpirun got a signal of its own (SIGTERM, SIGINT or SIGHUP?), which it does not pass on to the "
            f"ranks: it began its kill path (SIGTERM to the ranks in 120 s; their output is held meanwhile), so the "
            f"ranks save and stop now (SIGUSR1). Stop a job by signalling this script, kill {job.proc.pid}, which "
            f"reaches the ranks at once (or kill -USR1 <mpirun pid>)")
    if job.proc.returncode != 0 or said[:1] != [want] or not complete or \
            f"launch: rank 0 reported: stopped after step {k} of 1000000 (SIGUSR1)" not in said or noise(err):
        job.dump()
        fail("SIGTERM to mpirun should be explained, the ranks should save and stop at once, and the launcher exit 0")
    wait_gone(list(ranks.values()) + mpirun, "after the launcher ended")


def launch(*args):
    """Runs the launcher (SIGINT at its default) to its end; returns the CompletedProcess."""
    return subprocess.run([LAUNCH, *args], cwd=ROOT, capture_output=True, text=True, timeout=HANG_S,
                          preexec_fn=sigint_default)


def check_clean(trainer, tmp):
    for i in range(3):
        proc = launch("-np", "2", trainer, "--config", "configs/toy.yaml", "--steps", "5")
        bad = noise(proc.stderr) + [ln for ln in proc.stderr.splitlines() if ln.startswith("launch")]
        print(f"clean: run {i + 1}: exit {proc.returncode}, {len(bad)} line(s) about /proc, from bash or the launcher")
        if proc.returncode != 0 or bad or "done: steps 1..5" not in proc.stderr:
            sys.stderr.write(proc.stderr[-3000:])
            fail(f"a good run should exit 0 without such lines: {bad}")


def check_quiet_failure(trainer, tmp):
    typo = ["-np", "2", trainer, "--config", "configs/toy.yaml", "--set", "train.stepz=3"]
    want = "trainer: error: unknown key 'train.stepz' in --set; did you mean 'train.steps'?\n"
    proc = launch(*typo)
    print(f"quiet-failure: a typo in --set: exit {proc.returncode}, output {proc.stdout + proc.stderr!r}")
    if proc.returncode != 1 or proc.stdout or proc.stderr != want:
        fail(f"expected exit 1 and exactly {want!r}")
    proc = launch("--verbose", *typo)
    said = re.compile(r"^launch: rank 0 \(pid \d+ on host \S+\) exited with status 1\. Ending the other ranks and "
                      r"mpirun, exit 1\.$", re.M)
    print(f"quiet-failure: --verbose: exit {proc.returncode}, {len(proc.stderr.splitlines())} line(s)")
    if proc.returncode != 1 or not proc.stderr.startswith(want) or not said.search(proc.stderr):
        sys.stderr.write(proc.stderr)
        fail("--verbose should add the launcher's line naming rank 0 and its status")
    # mpirun's own failure, which -q leaves unexplained: the launcher points to --verbose.
    proc = launch("-np", "2", os.path.join(tmp, "no-such-program"))
    want = (f"launch: mpirun exited with status {proc.returncode} before any rank ended; run again with --verbose "
            "(first argument) for mpirun's own messages\n")  # Open MPI 4.1 exits 132 here
    print(f"quiet-failure: a program that does not exist: exit {proc.returncode}, output {proc.stdout + proc.stderr!r}")
    if proc.returncode == 0 or proc.stdout or proc.stderr != want:
        fail(f"expected mpirun's non-zero exit and exactly {want!r}")


def check_sigint_ignored(trainer, tmp):
    metrics = os.path.join(tmp, "ignored.jsonl")
    job = Job([LAUNCH, "-np", "2", trainer] + TINY + ["--set", f"logging.metrics_file={metrics}"],
              preexec=sigint_ignored)
    pid = job.proc.pid
    warned = job.wait_for_line("launch: SIGINT")
    want = (f"launch: SIGINT is ignored in this shell (started in the background?), so Ctrl-C and kill -INT cannot "
            f"stop this run; stop it with kill {pid} (SIGTERM) or kill -USR1 {pid}\n")
    wait_for_steps(metrics, 2, job)
    job.proc.send_signal(signal.SIGINT)
    at_sigint = len(metrics_rows(metrics))
    wait_for_steps(metrics, at_sigint + 3, job)  # the event line too: 2 steps after the SIGINT
    job.proc.send_signal(signal.SIGTERM)
    err = job.finish()
    last = metrics_rows(metrics)[-1]["step"]
    print(f"sigint-ignored: {warned.strip()}")
    print(f"sigint-ignored: SIGINT after step {at_sigint}, SIGTERM after step {last}: exit {job.proc.returncode}")
    if warned != want or err.count("launch: SIGINT is ignored") != 1 or last < at_sigint + 2 or \
            job.proc.returncode != 0 or f"stopped after step {last} of 1000000 (SIGTERM)" not in err or noise(err):
        job.dump()
        fail(f"expected the warning {want!r} once, training on after SIGINT, and a stop by SIGTERM saying so")


def check_signal_names(trainer, tmp):
    for sig in (signal.SIGUSR1, signal.SIGHUP):
        metrics = os.path.join(tmp, f"{sig.name}.jsonl")
        job = Job([LAUNCH, "-np", "2", trainer] + TINY + ["--set", f"logging.metrics_file={metrics}"])
        wait_for_steps(metrics, 2, job)
        job.proc.send_signal(sig)
        err = job.finish()
        last = metrics_rows(metrics)[-1]["step"]
        line = next((ln.strip() for ln in err.splitlines() if "stopped after step" in ln), "")
        print(f"signal-names: {sig.name} to the launcher: exit {job.proc.returncode}: {line}")
        if job.proc.returncode != 0 or not line.endswith(f"stopped after step {last} of 1000000 ({sig.name}); no "
                                                         "checkpoint.dir, so nothing was saved"):
            job.dump()
            fail(f"the last line should name {sig.name}")


def usr1_caught(pid):
    """Whether `pid` has a handler for SIGUSR1 (its SigCgt mask), None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(ln.split()[1] for ln in f if ln.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return None
    return bool(int(mask, 16) >> (signal.SIGUSR1 - 1) & 1)


def check_late_signal(trainer, tmp):
    metrics = os.path.join(tmp, "late.jsonl")
    job = Job([LAUNCH, "-np", "2", trainer] + TINY + ["--set", f"logging.metrics_file={metrics}"])
    wait_for_steps(metrics, 3, job)
    pids = rank_pids(metrics)
    os.kill(pids[0], signal.SIGUSR1)  # rank 0 alone: the ranks agree to stop
    job.wait_for_line("done: steps")
    # A late copy of the stop (another rank's launch-rank passing it on): sent to each rank once its stop handler is
    # gone, i.e. once it has left training, unless it has exited first.
    late, waiting = [], set(pids.values())
    deadline = time.time() + HANG_S
    while waiting and time.time() < deadline:
        for pid in list(waiting):
            caught = usr1_caught(pid)
            if caught is None:
                waiting.discard(pid)
            elif not caught:
                os.kill(pid, signal.SIGUSR1)
                late.append(pid)
                waiting.discard(pid)
        time.sleep(0.001)
    err = job.finish()
    print(f"late-signal: SIGUSR1 to {len(late)} rank(s) after they left training; launcher exit {job.proc.returncode}")
    if job.proc.returncode != 0 or "killed by SIGUSR1" in err or "stopped after step" not in err:
        job.dump()
        fail("a SIGUSR1 arriving after a rank has stopped should leave it exiting 0")


def check_errors_once(trainer, tmp):
    proc = launch("-np", "3", trainer, "--config", "configs/llama-tiny.yaml", "--set", "train.global_batch_size=16",
                  "--set", "train.micro_batch_size=4")
    want = ("trainer: error: train.global_batch_size (16) must be divisible by world size (3) x "
            "train.micro_batch_size (4) = 12; at 3 rank(s) set train.global_batch_size to 12 or 24; or run 1, 2 or 4 "
            "rank(s) (-np) with these batch sizes")
    lines = [ln for ln in proc.stderr.splitlines() if " INFO " not in ln]
    print(f"errors-once: 3 ranks, global batch 16 of micro-batches 4: exit {proc.returncode}: {lines}")
    if proc.returncode != 1 or lines != [want]:
        sys.stderr.write(proc.stderr)
        fail(f"expected exit 1 and the one line {want!r}")
    # train.device: cuda without a GPU (or without CUDA built in): every rank finds it; one line. (With a GPU the
    # run simply trains its one step.)
    proc = launch("-np", "2", trainer, "--config", "configs/llama-tiny.yaml", "--steps", "2", "--set",
                  "train.device=cuda")
    lines = [ln for ln in proc.stderr.splitlines() if " INFO " not in ln]
    print(f"errors-once: 2 ranks, train.device=cuda: exit {proc.returncode}: {lines}")
    if proc.returncode != 0 and (len(lines) != 1 or not lines[0].startswith("trainer: error: train.device: cuda, but ")):
        sys.stderr.write(proc.stderr)
        fail("train.device: cuda without a GPU should print one error line")
    proc = launch("-np", "2", trainer, "--self-check")
    want = "trainer: error: missing --config FILE (for example --config configs/toy.yaml)\n"
    print(f"errors-once: 2 ranks, --self-check without --config: exit {proc.returncode}: {proc.stderr!r}")
    if proc.returncode != 2 or proc.stderr != want or proc.stdout:
        fail(f"expected exit 2 and exactly {want!r}")
    for flags in (["--help"], ["--config", "configs/toy.yaml", "--print-config"]):
        alone = subprocess.run([trainer, *flags], cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
        proc = launch("-np", "2", trainer, *flags)
        print(f"errors-once: 2 ranks, {' '.join(flags)}: exit {proc.returncode}, {len(proc.stdout.splitlines())} "
              f"line(s) on stdout, {len(alone.stdout.splitlines())} from one process")
        if proc.returncode != 0 or proc.stdout != alone.stdout or not alone.stdout or proc.stderr:
            fail(f"{' '.join(flags)} at 2 ranks should print what one process prints, once")


def check_split(trainer, tmp):
    launcher_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_", "PMI", "SLURM_")) and k not in launcher_vars}
    for extra, who, n in (({"RANK": "1", "WORLD_SIZE": "2"}, "torchrun (WORLD_SIZE=2, RANK=1)", 2),
                          ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}, "Slurm (SLURM_NTASKS=2, SLURM_PROCID=0)", 2)):
        root = os.path.join(tmp, "split-" + "-".join(extra))
        proc = subprocess.run([trainer, "--config", "configs/toy.yaml", "--set", f"checkpoint.dir={root}"],
                              cwd=ROOT, capture_output=True, text=True, env=dict(base, **extra), timeout=HANG_S)
        want = (f"trainer: error: this process was started as one of {n} processes by {who}, but there is no MPI "
                f"world (none of OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMI_RANK or PMIX_RANK is set): each process "
                f"would run alone, on the same files. Launch through MPI: scripts/launch -np {n} PROGRAM ... "
                f"(mpirun), or srun --mpi=pmix")
        print(f"split: {' '.join(f'{k}={v}' for k, v in extra.items())}: exit {proc.returncode}: "
              f"{proc.stderr.strip()[:160]}")
        if proc.returncode != 1 or proc.stderr.strip() != want or proc.stdout or os.path.exists(root):
            sys.stderr.write(proc.stdout + proc.stderr)
            fail(f"expected exit 1, nothing done (no {root}) and exactly: {want}")
    proc = subprocess.run([trainer, "--config", "configs/toy.yaml", "--steps", "3"], cwd=ROOT, capture_output=True,
                          text=True, env=dict(base, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"), timeout=HANG_S)
    print(f"split: RANK=0 WORLD_SIZE=1 LOCAL_RANK=0: exit {proc.returncode}")
    if proc.returncode != 0 or "1 rank(s) (local backend)" not in proc.stderr:
        sys.stderr.write(proc.stderr[-3000:])
        fail("a one-process torchrun environment should run")


def main():
    check_main({"rank-killed": check_rank_killed, "second-signal": check_second_signal,
                "launcher-killed": check_launcher_killed, "clean": check_clean, "split": check_split,
                "quiet-failure": check_quiet_failure, "sigint-ignored": check_sigint_ignored,
                "signal-names": check_signal_names, "errors-once": check_errors_once,
                "late-signal": check_late_signal, "agent-killed": check_agent_killed,
                "mpirun-signalled": check_mpirun_signalled})


if __name__ == "__main__":
    main()
