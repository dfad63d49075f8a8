#!/usr/bin/env python3
"""What a program loads and how often it starts (standard library only; no timing: bench/RESULTS.md has it).

    check_startup.py TRAINER GENERATE CHECK

CHECK is one of:
  libraries  `trainer --help`, `trainer --config configs/llama-tiny.yaml --print-config`, a config error,
             `generate --help` and a 1-step CPU run of llama-tiny, each under LD_DEBUG=files: the dynamic
             loader starts the program exactly once (one "initialize program" line: no re-execution), and
             none of libcublas, libcublasLt, libnccl, libcudart, libcuda is loaded (a CUDA build opens them
             only when a GPU run calls them; in a build without CUDA this part holds trivially). The run's
             first line says "| train.device: cpu, CUDA " where a GPU run counts the visible GPUs (a CPU
             run does not start the CUDA runtime to ask).
  spin       libgomp's own report of its settings (OMP_DISPLAY_ENV=verbose), printed when it initialises:
             with neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT set, the trainer and generate start libgomp
             once, with GOMP_SPINCOUNT = '2000' (also each of 2 ranks that scripts/launch starts); a user's GOMP_SPINCOUNT=12345 and a user's
             OMP_WAIT_POLICY=passive are left alone (libgomp reports 12345, and 0 for passive); an
             environment with none of the entries the setting borrows while libgomp starts (`_`, OLDPWD,
             SHLVL, PWD: core/cpu/parallel.h) keeps libgomp's default, 300000, and still starts once.
Each check prints what it observed; a failure exits 1.
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, check_main, fail, sets  # noqa: E402

CUDA_LIBRARY = re.compile(r"file=(libcublasLt|libcublas|libnccl|libcudart|libcuda)\.so[^ ]*")
HANG_S = 240  # a hang guard only


def clean_env(**extra):
    """This environment without the OpenMP settings the checks are about, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_DISPLAY_ENV", "LD_DEBUG")}
    env.update(extra)
    return env


def run_env(cmd, env, code):
    """Runs `cmd` in ROOT with `env`; fails unless it exits with `code`. Returns stdout + stderr."""
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=HANG_S)
    if proc.returncode != code:
        sys.stderr.write((proc.stdout + proc.stderr)[-4000:])
        fail(f"{' '.join(cmd)}: exit {proc.returncode}, expected {code}")
    return proc.stdout + proc.stderr


def commands(trainer, generate, tmp):
    """(name, command, exit code) of each program start the checks look at."""
    tiny = [trainer, "--config", "configs/llama-tiny.yaml"]
    run = sets(checkpoint__dir=os.path.join(tmp, "ckpt"), logging__metrics_file=os.path.join(tmp, "m.jsonl"))
    return [("trainer --help", [trainer, "--help"], 0),
            ("trainer --print-config", tiny + ["--print-config"], 0),
            ("trainer config error", tiny + ["--set", "train.steps=many"], 1),
            ("generate --help", [generate, "--help"], 0),
            ("trainer 1-step CPU run", tiny + ["--steps", "1"] + run, 0)]


def check_libraries(trainer, generate, tmp):
    for name, cmd, code in commands(trainer, generate, tmp):
        out = run_env(cmd, clean_env(LD_DEBUG="files"), code)
        starts = out.count("initialize program:")
        loaded = sorted(set(m.group(0) for m in CUDA_LIBRARY.finditer(out)))
        print(f"libraries: {name}: {starts} program start(s), CUDA libraries loaded: {loaded or 'none'}")
        if starts != 1:
            fail(f"{name}: the loader started a program {starts} times; expected once (no re-execution)")
        if loaded:
            fail(f"{name}: a CPU-only start loaded {loaded}")
        if name.endswith("CPU run") and "| 1 rank(s) (local backend) | train.device: cpu, CUDA " not in out:
            fail(f"{name}: the first line should say the run is on the CPU instead of counting GPUs")


def spin_counts(cmd, env, code):
    """The GOMP_SPINCOUNT values libgomp reports, one per time it initialised."""
    out = run_env(cmd, env, code)
    return re.findall(r"GOMP_SPINCOUNT = '(\d+)'", out)


def check_spin(trainer, generate, tmp):
    verbose = {"OMP_DISPLAY_ENV": "verbose"}
    cases = [("trainer --help", [trainer, "--help"], clean_env(**verbose), ["2000"]),
             ("generate --help", [generate, "--help"], clean_env(**verbose), ["2000"]),
             ("scripts/launch -np 2 trainer --help", [os.path.join(ROOT, "scripts", "launch"), "-np", "2", trainer,
                                                      "--help"], clean_env(**verbose), ["2000", "2000"]),
             ("trainer --help, GOMP_SPINCOUNT=12345", [trainer, "--help"],
              clean_env(GOMP_SPINCOUNT="12345", **verbose), ["12345"]),
             ("trainer --help, OMP_WAIT_POLICY=passive", [trainer, "--help"],
              clean_env(OMP_WAIT_POLICY="passive", **verbose), ["0"]),
             ("trainer --help, only PATH set", [trainer, "--help"], dict(PATH=os.environ["PATH"], **verbose),
              ["300000"])]
    for name, cmd, env, want in cases:
        got = spin_counts(cmd, env, 0)
        print(f"spin: {name}: libgomp reported GOMP_SPINCOUNT {got}")
        if got != want:
            fail(f"{name}: libgomp reported GOMP_SPINCOUNT {got}; expected {want} (one start of libgomp)")


def main():
    check_main({"libraries": check_libraries, "spin": check_spin}, programs=2)


if __name__ == "__main__":
    main()
