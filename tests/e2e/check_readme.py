#!/usr/bin/env python3
"""Every quick-start command of the README runs and exits 0 (standard library only).

    check_readme.py BUILD_DIR

The commands are read from README.md itself, so the two cannot diverge: the
README's two opening commands and every line of the code block under
"## Quick start". `scripts/setup.sh` (which CI has just run) and
`scripts/test.sh` (which is CI itself) are not run again; `build/` becomes
BUILD_DIR. Each command runs from the repository root in a shell.
"""
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT  # noqa: E402

SKIP = ("scripts/setup.sh", "scripts/test.sh")


def code_blocks(text):
    return re.findall(r"```sh\n(.*?)```", text, flags=re.S)


def commands(readme):
    with open(readme) as f:
        text = f.read()
    blocks = code_blocks(text)
    opening = blocks[0]
    quick = text.split("## Quick start", 1)[1]
    quick_block = code_blocks(quick)[0]
    out = []
    for block in (opening, quick_block):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if not line:
                continue
            # "scripts/setup.sh && X" runs X; setup itself is what CI just did.
            parts = [p.strip() for p in line.split("&&") if p.strip() not in SKIP]
            if parts:
                out.append(" && ".join(parts))
    return out


def main():
    build = os.path.abspath(sys.argv[1])
    cmds = commands(os.path.join(ROOT, "README.md"))
    if len(cmds) < 5:
        print(f"FAIL: found only {len(cmds)} quick-start commands in README.md: {cmds}")
        sys.exit(1)
    failed = []
    for cmd in cmds:
        real = re.sub(r"(?<![\w/])build/", build + "/", cmd)
        t0 = time.time()
        proc = subprocess.run(["bash", "-c", real], cwd=ROOT, capture_output=True, text=True)
        print(f"exit {proc.returncode} in {time.time() - t0:5.1f} s: {cmd}")
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-1500:] + proc.stderr[-1500:])
            failed.append(cmd)
    if failed:
        print(f"FAIL: {len(failed)} README command(s) failed: {failed}")
        sys.exit(1)
    print(f"all {len(cmds)} quick-start commands of README.md exit 0")


if __name__ == "__main__":
    main()
