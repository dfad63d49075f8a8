#!/usr/bin/env python3
"""Every path the documentation cites exists (standard library only).

    check_doc_paths.py [REPO_ROOT]

Scans the repository's Markdown files whole, and the comments of its C++,
CUDA, CMake, Python, shell and YAML files (Python docstrings included), for
three kinds of citation:

  - a repository-relative path such as core/state.h, docs/DESIGN.md or
    scripts/launch, recognised by its first component being a top-level
    folder of the repository (so output paths such as build/..., runs/...
    or ckpt/... in examples are not citations); `{a,b}` alternatives are
    expanded and `*` or `<placeholder>` match any name;
  - a Markdown link target, resolved against the linking file's folder,
    with its #anchor checked against the target page's headings;
  - a section cited as FILE.md, "Heading" (as in a header's
    (docs/DESIGN.md, "State entries")), checked against FILE's headings:
    a heading that starts with the cited words matches.

What exists is what git knows (tracked files and untracked ones that are
not ignored), so a file left in a build tree does not count. Prints one
line per broken citation, FILE:LINE: what is missing, and exits 1 if there
is any.
"""
import fnmatch
import io
import os
import re
import subprocess
import sys
import tokenize

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))

# Outputs and local caches that examples name, never committed: checked only
# if their first folder is a source folder too, so they are listed here.
ALLOWED = [
    re.compile(p)
    for p in (
        r"^tests/__pycache__(/|$)",
        r"^bench/out(/|$)",  # bench/*.sh write their results here
        r"^data/fortunes(/|$)",  # the tutorial's and prepare's output
        r"^(runs|ckpt|build[^/]*)(/|$)",  # run, checkpoint and build directories
    )
]

CPP = (".h", ".hpp", ".cpp", ".cc", ".c", ".cu", ".cuh")
HASH = (".py", ".sh", ".cmake", ".yaml", ".yml", ".txt")
SEGMENT = r"(?:\{[^}\s/]*\}|<[^>\s/]*>|[A-Za-z0-9_.\-*])"
PATH_RE = re.compile(r"(?<![\w./\-~$%@])((?:[A-Za-z0-9_.\-]+)(?:/" + SEGMENT + r"*)+)")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
SECTION_RE = re.compile(r"([A-Za-z0-9_./\-]+\.md)`?,?\s+\"([^\"]+)\"")


def repo_files():
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             check=True, capture_output=True, text=True).stdout
        files = {f for f in out.split("\0") if f and os.path.exists(os.path.join(ROOT, f))}
    except (OSError, subprocess.CalledProcessError):
        files = set()
        for top, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not d.startswith((".git", "build"))]
            files.update(os.path.relpath(os.path.join(top, n), ROOT) for n in names)
    dirs = set()
    for f in files:
        parts = f.split("/")
        for i in range(1, len(parts)):
            dirs.add("/".join(parts[:i]))
    return files, dirs


FILES, DIRS = repo_files()
TOP = {d for d in DIRS if "/" not in d}
ALL = FILES | DIRS


def expand_braces(path):
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",") for x in expand_braces(path[:m.start()] + alt + path[m.end():])]


def missing(path):
    """The expansions of `path` that name nothing in the repository."""
    path = path.rstrip("/")
    if any(r.search(path) for r in ALLOWED):
        return []
    out = []
    for p in expand_braces(re.sub(r"<[^>]*>", "*", path)):
        p = os.path.normpath(p)
        found = fnmatch.filter(ALL, p) if any(c in p for c in "*?[") else p in ALL
        if not found:
            out.append(p)
    return out


def slug(heading):
    """GitHub's anchor for a heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_headings = {}


def headings(md):
    if md not in _headings:
        names, fenced = [], False
        with open(os.path.join(ROOT, md), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("```"):
                    fenced = not fenced
                elif not fenced and re.match(r"#{1,6} ", line):
                    names.append(line.lstrip("#").strip())
        _headings[md] = names
    return _headings[md]


def norm_heading(text):
    return re.sub(r"\s+", " ", text.replace("`", "")).strip().lower()


# ---- where the citations are: (line number, text) pairs per file -------------------


def md_lines(text):
    return list(enumerate(text.splitlines(), 1))


def cpp_comments(text):
    """Comment text of C++/CUDA source, by line (string and char literals skipped)."""
    out, i, line, n = [], 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append((line, text[i + 2:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(text[i + 2:j].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, j)
            i = j + 2
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + (m.group(1) if m else "") + '"', i)
            end = n if end < 0 else end
            line += text.count("\n", i, end)
            i = end + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def python_comments(text):
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string[1:]))
            elif tok.type == tokenize.STRING and tok.string.lstrip("rbuRBU").startswith(('"""', "'''")):
                for k, part in enumerate(tok.string.split("\n")):
                    out.append((tok.start[0] + k, part))
    except (tokenize.TokenError, SyntaxError):
        return hash_comments(text)
    return out


def hash_comments(text):
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if number == 1 and line.startswith("#!"):
            continue
        m = re.search(r"(?:^|\s)#(.*)$", line)
        if m:
            out.append((number, m.group(1)))
    return out


def is_shell(path, text):
    return text.startswith("#!") and re.match(r"#!.*\b(ba)?sh\b", text.splitlines()[0]) is not None


def citation_lines(path):
    full = os.path.join(ROOT, path)
    try:
        with open(full, encoding="utf-8") as f:
            text = f.read()
    except (UnicodeDecodeError, OSError):
        return None, []
    name = os.path.basename(path)
    if name.endswith(".md"):
        return "md", md_lines(text)
    if name.endswith(CPP):
        return "code", cpp_comments(text)
    if name.endswith(".py"):
        return "code", python_comments(text)
    if name.endswith(HASH) or name == "CMakeLists.txt" or is_shell(path, text):
        return "code", hash_comments(text)
    return None, []


# ---- the checks -----------------------------------------------------------------------


def resolve_md(src, target):
    """A Markdown file named in `src`: repository-relative, or relative to src's folder."""
    first = target.split("/", 1)[0]
    candidates = [os.path.normpath(os.path.join(os.path.dirname(src), target))]
    if first in TOP:
        candidates.insert(0, os.path.normpath(target))
    for c in candidates:
        if c in FILES:
            return c
    return None


def check_line(src, kind, text, problems, number):
    for m in PATH_RE.finditer(text):
        path = m.group(1).rstrip(".-")
        first = path.split("/", 1)[0]
        if first not in TOP or "..." in path:
            continue
        gone = missing(path)
        if gone == [path.rstrip("/")]:
            problems.append(f"{src}:{number}: cites '{path}', which does not exist")
        elif gone:
            problems.append(f"{src}:{number}: cites '{path}': {', '.join(gone)} does not exist")
    if kind == "md":
        for m in LINK_RE.finditer(text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(src), file)) if file else src
            if file and resolved not in ALL:
                problems.append(f"{src}:{number}: links to '{target}': no {resolved}")
            elif anchor and resolved.endswith(".md") and anchor not in {slug(h) for h in headings(resolved)}:
                problems.append(f"{src}:{number}: links to '{target}': {resolved} has no heading with anchor #{anchor}")
    for m in SECTION_RE.finditer(text):
        md = resolve_md(src, m.group(1))
        if md is None:
            continue  # a missing file is reported above when its path is a citation
        # A heading may go on after the cited words: "GPU first light" cites
        # "GPU first light (`bench/gpu_bench.sh`, issue 28) - one NVIDIA H100".
        wanted = norm_heading(m.group(2))
        if not any(re.match(re.escape(wanted) + r"(\W|$)", norm_heading(h)) for h in headings(md)):
            problems.append(f"{src}:{number}: cites section \"{m.group(2)}\" of {md}, which has no such heading")


def main():
    problems, scanned = [], 0
    for src in sorted(FILES):
        kind, lines = citation_lines(src)
        if not kind:
            continue
        scanned += 1
        for number, text in lines:
            check_line(src, kind, text, problems, number)
    for p in problems:
        print(p)
    if problems:
        print(f"FAIL: {len(problems)} broken citation(s) in {scanned} files")
        sys.exit(1)
    print(f"every cited path, link and section in {scanned} files exists")


if __name__ == "__main__":
    main()
