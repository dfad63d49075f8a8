#!/usr/bin/env python3
"""What a program loads, how often it starts and how it answers its command line (standard library only; no
timing: bench/RESULTS.md has it).

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
  usage      one behaviour for every program (trainer, generate, prepare, plot, ckpt -- the last three from
             the trainer's build directory -- and scripts/launch): no arguments print the usage on stderr,
             nothing on stdout, exit 2; --help prints the same usage on stdout, exit 0 (scripts/launch: its
             own usage, not mpirun's).
  generate   generate on a toy checkpoint says the toy model cannot generate text (exit 1, no word of a
             tokenizer); generate --logits FIFO on a llama-tiny checkpoint and plot of a FIFO end at once
             (exit 1, "is not a regular file (a FIFO)") instead of blocking in open() (a hang guard only).
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


def programs(trainer, generate):
    """(name, command) of every program the usage check covers."""
    build = os.path.dirname(trainer)
    return [("trainer", [trainer]), ("generate", [generate]), ("prepare", [os.path.join(build, "prepare")]),
            ("plot", [os.path.join(build, "plot")]), ("ckpt", [os.path.join(build, "ckpt")]),
            ("scripts/launch", [os.path.join(ROOT, "scripts", "launch")])]


def check_usage(trainer, generate, tmp):
    for name, cmd in programs(trainer, generate):
        bare = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
        helped = subprocess.run(cmd + ["--help"], cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
        if bare.returncode != 2 or bare.stdout or not bare.stderr.startswith("usage: "):
            fail(f"{name} without arguments: exit {bare.returncode} (expected 2), stdout {bare.stdout[:80]!r}, "
                 f"stderr {bare.stderr[:80]!r} (expected the usage)")
        if helped.returncode != 0 or helped.stderr or not helped.stdout.startswith(bare.stderr.splitlines()[0]):
            fail(f"{name} --help: exit {helped.returncode} (expected 0), stdout {helped.stdout[:80]!r}, "
                 f"stderr {helped.stderr[:80]!r} (expected the usage on stdout)")
        print(f"usage: {name}: no arguments -> usage on stderr, exit 2; --help -> usage on stdout, exit 0 "
              f"({bare.stderr.splitlines()[0][:70]})")
    if "mpirun" in helped.stdout.splitlines()[0]:
        fail("scripts/launch --help printed mpirun's help")


def run_guarded(cmd, what):
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        fail(f"{what}: hung (no end within {HANG_S} s)")


def check_generate(trainer, generate, tmp):
    toy = os.path.join(tmp, "toy")
    run_env([trainer, "--config", "configs/toy.yaml", "--steps", "1"] + sets(checkpoint__dir=toy), clean_env(), 0)
    proc = run_guarded([generate, "--checkpoint", os.path.join(toy, "step-000001"), "--prompt", "hi"], "toy")
    out = proc.stdout + proc.stderr
    if proc.returncode != 1 or "the toy model" not in out or "cannot generate text" not in out or "tokenizer" in out:
        fail(f"generate on a toy checkpoint: exit {proc.returncode}: {out[-600:]}")
    print(f"generate: toy checkpoint: {out.strip()}")
    tiny = os.path.join(tmp, "tiny")
    run_env([trainer, "--config", "configs/llama-tiny.yaml", "--steps", "1"] + sets(checkpoint__dir=tiny),
            clean_env(), 0)
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    proc = run_guarded([generate, "--checkpoint", os.path.join(tiny, "step-000001"), "--prompt", "hi",
                        "--max-new-tokens", "2", "--logits", fifo], "generate --logits FIFO")
    want = f"--logits file '{fifo}' is not a regular file (a FIFO)"
    if proc.returncode != 1 or want not in proc.stderr:
        fail(f"generate --logits FIFO: exit {proc.returncode}: {proc.stderr[-600:]}")
    print(f"generate: --logits FIFO: exit 1 at once: {proc.stderr.strip()}")
    plot = os.path.join(os.path.dirname(trainer), "plot")
    proc = run_guarded([plot, fifo, "-o", os.path.join(tmp, "p.svg")], "plot of a FIFO")
    want = f"metrics file '{fifo}' is not a regular file (a FIFO)"
    if proc.returncode != 1 or want not in proc.stderr:
        fail(f"plot of a FIFO: exit {proc.returncode}: {proc.stderr[-600:]}")
    print(f"generate: plot of a FIFO: exit 1 at once: {proc.stderr.strip()}")


def main():
    check_main({"libraries": check_libraries, "spin": check_spin, "usage": check_usage,
                "generate": check_generate}, programs=2)


if __name__ == "__main__":
    main()
