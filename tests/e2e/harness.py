"""Helpers shared by the Python checks that run shardtrain's programs (tests/e2e/,
and tests/reference/ where a check trains first). Standard library only, so a
check that needs no torch or numpy runs on any Python 3.

A check script imports what it uses:

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))    # tests/e2e/
    from harness import ROOT, fail, mpirun, run  # noqa: E402

and ends with check_main({name: function}), which runs one named check in a
fresh temporary directory. Nothing here asserts anything about the programs:
the bounds and expected messages live in the checks.
"""
import json
import os
import subprocess
import sys
import tempfile

# The repository root: every command runs there, so configs/ paths resolve.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A 35 KB English text that every Debian system has (package base-files).
TEXT = "/usr/share/common-licenses/GPL-3"
# The exit code CTest reports as Skipped (SKIP_RETURN_CODE in the CMakeLists).
SKIP = 77


# --- failing and running -------------------------------------------------------------

def fail(msg):
    """Prints the failure and exits 1: the check (and its CTest test) fails."""
    print("FAIL:", msg)
    sys.exit(1)


def mpirun(np):
    """The mpirun prefix of an np-rank job on this machine (more ranks than cores, root in CI)."""
    flags = ["mpirun", "-np", str(np), "--oversubscribe"]
    if os.geteuid() == 0:
        flags.append("--allow-run-as-root")
    return flags


def run(cmd, expect_ok=True):
    """Runs `cmd` in ROOT, capturing its output; fails the check on a non-zero exit
    unless expect_ok is False. Returns the CompletedProcess."""
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if expect_ok and proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        fail(f"command failed with exit code {proc.returncode}: {' '.join(cmd)}")
    return proc


def expect(proc, code, *texts, what=""):
    """Fails unless `proc` exited with `code` and its output holds every text; returns the output."""
    out = proc.stdout + proc.stderr
    missing = [t for t in texts if t not in out]
    if proc.returncode != code or missing:
        sys.stderr.write(out[-4000:])
        fail(f"{what}: exit {proc.returncode} (expected {code}); missing from the output: {missing}")
    return out


def sets(**kv):
    """--set arguments; a double underscore in a name stands for a dot: checkpoint__dir=x."""
    out = []
    for k, v in kv.items():
        out += ["--set", f"{k.replace('__', '.')}={v}"]
    return out


def check_main(checks, programs=1):
    """The main of a check script called as `SCRIPT PROGRAM... CHECK`: runs
    checks[CHECK](*programs, tmp) with each program path made absolute and tmp a
    fresh temporary directory, removed afterwards."""
    paths = [os.path.abspath(p) for p in sys.argv[1:1 + programs]]
    check = sys.argv[1 + programs]
    with tempfile.TemporaryDirectory() as tmp:
        checks[check](*paths, tmp)


# --- reading what the programs wrote ---------------------------------------------------

def metrics_lines(path):
    """Every line of a metrics JSONL file as a dict, in file order (blank lines skipped)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def metrics_rows(path):
    """The step lines of a metrics JSONL file, in file order: the event lines
    ({"event": "start"|"resume", "step": N, "run_name": ...}) that mark where
    each run began are left out."""
    return [r for r in metrics_lines(path) if "event" not in r]


def loss_by_step(path):
    """{step: loss} of a metrics JSONL file (for a step logged twice, the later line)."""
    return {r["step"]: r["loss"] for r in metrics_rows(path)}


def rank_pids(tag):
    """{rank: pid} of the trainer processes whose command line holds `tag`."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            if tag not in cmd or "trainer" not in cmd.split("\0")[0]:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0") if "=" in kv)
        except OSError:
            continue
        if "OMPI_COMM_WORLD_RANK" in env:
            out[int(env["OMPI_COMM_WORLD_RANK"])] = int(pid)
    return out


# --- editing checkpoints with valid checksums ------------------------------------------

def _crc_table():
    table = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc_table()


def crc32c(data):
    """CRC32C (Castagnoli), the checksum of the checkpoint files and their COMPLETE marker."""
    c = 0xFFFFFFFF
    for byte in data:
        c = CRC_TABLE[(c ^ byte) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def resum_marker(ckpt, name):
    """Records the new whole-file CRC32C of `name` in ckpt's COMPLETE marker (and
    the marker's own CRC), as a save that wrote this content would have."""
    marker_path = os.path.join(ckpt, "COMPLETE")
    with open(marker_path) as f:
        lines = f.read().splitlines()[:-1]  # without its crc32c line
    with open(os.path.join(ckpt, name), "rb") as f:
        content = f.read()
    for i, line in enumerate(lines):
        fields = line.split(" ", 3)
        if fields[0] == "sum" and fields[3] == name:
            lines[i] = f"sum {len(content)} {crc32c(content):08x} {name}"
    body = "".join(line + "\n" for line in lines)
    with open(marker_path, "w") as f:
        f.write(body + f"crc32c {crc32c(body.encode()):08x}\n")
