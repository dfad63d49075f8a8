#!/usr/bin/env python3
"""The source follows the include graph the README draws (standard library only).

    check_include_graph.py [REPO_ROOT]

README.md holds one fenced block tagged include-graph: one line per library
folder (`dataset: core models`) or program (`tools/plot.cpp: core metrics`),
naming the top-level folders its files may include. A folder may always
include itself. This check reads every C++/CUDA file under the folders and
programs the block names, takes each `#include "FOLDER/..."` whose FOLDER is
a top-level folder of the repository, and fails on any FOLDER the block does
not allow, printing FILE:LINE, the include and the rule it breaks. It also
fails when a folder holding C++ sources is in no line and not exempt
(bench/, fuzz/ and tests/ may include any library), so a new library cannot
escape the graph. Exits 1 on any violation.
"""
import os
import re
import subprocess
import sys

EXEMPT = {"bench", "fuzz", "tests"}
SOURCE = re.compile(r"\.(h|hpp|cpp|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def fail(msg):
    print(f"check_include_graph: {msg}", file=sys.stderr)
    sys.exit(1)


def read_graph(readme):
    """{key: allowed folders}, key a folder ('dataset') or a program file ('tools/plot.cpp')."""
    text = open(readme, encoding="utf-8").read()
    block = re.search(r"^```include-graph\n(.*?)^```", text, re.S | re.M)
    if not block:
        fail(f"{readme}: no ```include-graph block")
    graph = {}
    for n, line in enumerate(block.group(1).splitlines(), 1):
        if not line.strip():
            continue
        key, sep, rest = line.partition(":")
        if not sep:
            fail(f"{readme}: include-graph line {n} '{line}' is not 'FROM: FOLDER...'")
        graph[key.strip()] = set(rest.split())
    return graph


def rule_for(path, graph):
    """The graph key that governs `path`, or None."""
    if path in graph:
        return path
    top = path.split("/", 1)[0]
    return top if top in graph else None


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    files = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard"],
                           check=True, capture_output=True, text=True).stdout.split()
    graph = read_graph(os.path.join(root, "README.md"))
    tops = {f.split("/", 1)[0] for f in files if "/" in f}
    for key, allowed in graph.items():
        for folder in allowed:
            if folder not in tops:
                fail(f"README.md: include-graph line '{key}' names '{folder}', which is not a top-level folder")
    problems = []
    unruled = set()
    checked = 0
    for path in sorted(f for f in files if SOURCE.search(f) and "/" in f):
        top = path.split("/", 1)[0]
        if top in EXEMPT:
            continue
        key = rule_for(path, graph)
        if key is None:
            unruled.add(path if top == "tools" else top)
            continue
        checked += 1
        allowed = graph[key] | {top}
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m or "/" not in m.group(1):
                    continue
                folder = m.group(1).split("/", 1)[0]
                if folder in tops and folder not in allowed:
                    problems.append(f"{path}:{n}: includes \"{m.group(1)}\", but README.md's include-graph "
                                    f"allows '{key}' only {' '.join(sorted(allowed))}")
    for p in problems:
        print(p)
    for u in sorted(unruled):
        print(f"{u}: holds C++ sources but has no line in README.md's include-graph block")
    if problems or unruled:
        print(f"FAIL: {len(problems)} include(s) against the graph, {len(unruled)} folder(s) or program(s) outside it")
        return 1
    print(f"{checked} source files follow README.md's include graph ({len(graph)} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
