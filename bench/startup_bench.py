#!/usr/bin/env python3
"""Start-up times of the programs (issue 25): the quick commands, and the time from
starting `scripts/launch` to the first step line of llama-tiny at 1 and 4 ranks.

    bench/startup_bench.py BUILD_DIR [REPEATS] [--cold]   # from the repository root; REPEATS defaults to 7

Each command runs REPEATS times, one after another; the table gives the median and the
range (min-max) in seconds of wall-clock time. With --cold, the page cache drops the programs,
the shared libraries `ldd` lists for them and every library of the CUDA Toolkit's lib folder before
each run (posix_fadvise DONTNEED: only pages no running process maps; nothing else is evicted), as
on a machine where other work has pushed them out. The results are in bench/RESULTS.md ("Start-up").
"""
import glob
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config", "configs/llama-tiny.yaml"]


def evictable(programs):
    """The programs, the libraries `ldd` finds for them, and the CUDA Toolkit's libraries."""
    files = set(programs)
    for program in programs:
        for line in subprocess.run(["ldd", program], capture_output=True, text=True).stdout.splitlines():
            parts = line.split("=>")
            if len(parts) == 2 and parts[1].strip().startswith("/"):
                files.add(parts[1].split()[0])
    files.update(glob.glob("/usr/local/cuda/lib/lib*.so*") + glob.glob("/usr/local/cuda/lib64/lib*.so*"))
    return sorted(os.path.realpath(f) for f in files)


def evict(files):
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def wall(cmd, code):
    """Seconds from start to exit of `cmd`, which must exit with `code`."""
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if proc.returncode != code:
        sys.exit(f"{' '.join(cmd)}: exit {proc.returncode}, expected {code}\n{proc.stderr[-2000:]}")
    return seconds


def first_step(cmd, tmp):
    """Seconds from start of `cmd` to its first step line ("step 1/"); the job then runs to its end."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = None
    for line in proc.stderr:
        if seconds is None and " step 1/" in line:
            seconds = time.monotonic() - start
    if proc.wait() != 0 or seconds is None:
        sys.exit(f"{' '.join(cmd)}: exit {proc.returncode}, first step line {'seen' if seconds else 'not seen'}")
    return seconds


def main():
    args = [a for a in sys.argv[1:] if a != "--cold"]
    cold = "--cold" in sys.argv
    build = args[0]
    repeats = int(args[1]) if len(args) > 1 else 7
    trainer, generate = os.path.join(build, "trainer"), os.path.join(build, "generate")
    files = evictable([trainer, generate]) if cold else []
    tmp = f"/tmp/startup_bench_{os.getpid()}"
    run = ["--steps", "3", "--set", f"checkpoint.dir={tmp}/ckpt", "--set", f"logging.metrics_file={tmp}/m.jsonl",
           "--overwrite"]
    cases = [
        ("trainer --help", lambda: wall([trainer, "--help"], 0)),
        ("trainer --config configs/llama-tiny.yaml --print-config",
         lambda: wall([trainer] + TINY + ["--print-config"], 0)),
        ("trainer --config configs/llama-tiny.yaml --set train.steps=many (config error)",
         lambda: wall([trainer] + TINY + ["--set", "train.steps=many"], 1)),
        ("generate --help", lambda: wall([generate, "--help"], 0)),
        ("scripts/launch -np 1 trainer llama-tiny --steps 3: first step line",
         lambda: first_step(["scripts/launch", "-np", "1", trainer] + TINY + run, tmp)),
        ("scripts/launch -np 4 trainer llama-tiny --steps 3: first step line",
         lambda: first_step(["scripts/launch", "-np", "4", trainer] + TINY + run, tmp)),
    ]
    print(f"build {build}, {repeats} runs each{', page cache dropped before each' if cold else ''}; "
          "seconds: median (min-max)")
    for name, measure in cases:
        times = []
        for _ in range(repeats):
            evict(files)
            times.append(measure())
        print(f"{name}: {statistics.median(times):.3f} ({min(times):.3f}-{max(times):.3f})", flush=True)
    subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
