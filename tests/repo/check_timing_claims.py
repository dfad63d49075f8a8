#!/usr/bin/env python3
"""Every timing the documentation claims says where and how it was measured (standard library only).

    check_timing_claims.py [REPO_ROOT]

A run takes several times longer on one machine kind than on another (the
2-core AMD EPYC and Intel Xeon kinds differ several-fold), so a bare "takes
2 s" misleads most readers. This check reads README.md and docs/*.md and
finds every duration in prose (a number followed by ms, s, min, minutes,
hours...; fenced and indented blocks, which show a program's output, and
`code spans`, which hold settings and commands, are skipped). The paragraph
(or list item) holding it must either

  - name the machine kind it was measured on (AMD EPYC, Intel Xeon, H100,
    H200) and hold a command in a code span that reproduces the figure (one
    that runs a program of the repository: scripts/..., build/..., bench/...,
    .ci/..., ctest, time ...), or
  - carry the marker <!-- durations: settings --> when its durations are
    settings or bounds of the program (a timeout, a period, a grace time), not
    measurements.

Prints FILE:LINE: the durations for each paragraph that does neither and
exits 1 if there is any.
"""
import glob
import os
import re
import sys

DURATION = re.compile(r"(?<![\w.])\d[\d,.]*(?:\s?(?:-|to)\s?\d[\d,.]*)?\s?"
                      r"(?:ms|µs|us|s|sec|seconds?|min|minutes?|h|hours?)(?![\w/])")
MACHINE = re.compile(r"\b(?:AMD EPYC|Intel Xeon|H100|H200)\b")
COMMAND = re.compile(r"`(?:time |ctest|\.ci/|scripts/|build/|bench/|python3? |/usr/bin/python3 )[^`]*`")
SETTINGS = "<!-- durations: settings -->"


def paragraphs(text):
    """(first line number, text) of each prose paragraph or list item; code blocks are left out."""
    out, current, start, fenced = [], [], 0, False

    def close():
        if current:
            out.append((start, "\n".join(current)))
            current.clear()

    for number, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            close()
            continue
        indented_code = line.startswith("    ") and not current
        if fenced or indented_code or not line.strip():
            close()
            continue
        if re.match(r"\s*(?:[-*+]|\d+\.)\s", line) or line.startswith(("#", "|")):
            close()
        if not current:
            start = number
        current.append(line)
    close()
    return out


def problems(path, text):
    found = []
    for line, paragraph in paragraphs(text):
        durations = [d.replace("\n", " ") for d in DURATION.findall(re.sub(r"`[^`]*`", "``", paragraph))]
        if not durations or SETTINGS in paragraph:
            continue
        if MACHINE.search(paragraph) and COMMAND.search(paragraph):
            continue
        missing = [what for what, ok in (("the machine kind", MACHINE.search(paragraph)),
                                         ("the command that measures it", COMMAND.search(paragraph))) if not ok]
        found.append(f"{path}:{line}: {', '.join(durations)}: names neither {' nor '.join(missing)}"
                     if len(missing) == 2 else f"{path}:{line}: {', '.join(durations)}: does not name {missing[0]}")
    return found


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../.."))
    files = ["README.md"] + sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))
    found = []
    for name in files:
        with open(os.path.join(root, name), encoding="utf-8") as f:
            found += problems(name, f.read())
    for line in found:
        print(line)
    print(f"timing claims: {len(files)} files, {len(found)} without a machine kind and a command")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
