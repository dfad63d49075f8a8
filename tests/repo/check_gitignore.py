#!/usr/bin/env python3
"""What the tutorial writes is ignored by git; the sources beside it are not.

    check_gitignore.py [REPO_ROOT]

docs/TUTORIAL.md's commands write into data/ and runs/ at the repository
root (hundreds of megabytes of tokens and checkpoints). Asks git itself
(`git check-ignore --no-index`, so tracked or not does not matter) about
files those commands create, and about source files whose names are close
(dataset/ is a source folder). Exits 1 naming each path git treats wrongly,
77 (CTest: skipped) outside a git checkout.
"""
import os
import subprocess
import sys

IGNORED = ["data/fortunes/tokenizer.model", "data/fortunes/train/train_000000.bin", "runs/fortunes/metrics.jsonl",
           "runs/fortunes/ckpt/step-000600/COMPLETE", "runs/toy/latest"]
KEPT = ["dataset/tokenizer.h", "dataset/README.md", "docs/TUTORIAL.md", "configs/tutorial.yaml",
        "tests/README.md"]


def ignored(root, path):
    proc = subprocess.run(["git", "-C", root, "check-ignore", "--no-index", "-q", path], capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        sys.exit(f"check_gitignore.py: git check-ignore {path}: {proc.stderr.strip()}")
    return proc.returncode == 0


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    inside = subprocess.run(["git", "-C", root, "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True)
    if inside.returncode != 0:
        print("check_gitignore.py: skipped, not a git checkout")
        sys.exit(77)
    wrong = [f"{p}: not ignored (a tutorial output)" for p in IGNORED if not ignored(root, p)]
    wrong += [f"{p}: ignored (a source file)" for p in KEPT if ignored(root, p)]
    for line in wrong:
        print(line)
    if wrong:
        sys.exit(1)
    print(f"check_gitignore.py: {len(IGNORED)} tutorial outputs ignored, {len(KEPT)} sources not: passed")


if __name__ == "__main__":
    main()
