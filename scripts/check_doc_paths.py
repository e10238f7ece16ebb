#!/usr/bin/env python3
"""Every path the docs name exists, and every link leads somewhere: the README, docs/*.md and docs/results/*.md,
deploy/ and bench/ READMEs.

    scripts/check_doc_paths.py [ROOT]    exit 0 when every named path exists, 1 naming each missing one

A bare file name with a source suffix (trainer_step.c, dist_lib.sh) must name a file somewhere in the tree.
A path is a word that starts with one of the tree's top-level folders (common/, worker/, tests/, ...) and names
a file or folder of the source tree. Globs (tests/system/*.sh) must match something; brace lists
(worker/plane/{wire,dataplane}.c) are expanded; a folder may end in '/'.
A Markdown link [text](target) to a file of the tree (relative to the document) must name an existing file, and
its #anchor, if any, a heading of that file (GitHub's anchors: lower case, punctuation dropped, spaces as '-');
a link to a web address is not checked.
"""
import glob
import os
import re
import sys

TOP = ("common", "proto", "kernels", "worker", "daemon", "ctl", "deploy", "tests", "bench", "scripts", "docs",
       ".ci")
BARE = re.compile(r"(?<![\w./~$<-])([A-Za-z0-9_-]+\.(?:c|h|cu|cuh|sh|py|def|proto|build))\b")
PATH = re.compile(r"(?<![\w./~$-])((?:%s)/[A-Za-z0-9_.*{},/+-]*)" % "|".join(re.escape(t) for t in TOP))


def expand(p):
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    out = []
    for alt in m.group(1).split(","):
        out += expand(p[:m.start()] + alt + p[m.end():])
    return out


def doc_files(root):
    files = [os.path.join(root, "README.md")]
    files += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    files += sorted(glob.glob(os.path.join(root, "docs", "results", "*.md")))
    for sub in ("deploy", "bench", "tests", "tests/fixtures"):
        f = os.path.join(root, sub, "README.md")
        if os.path.exists(f):
            files.append(f)
    return [f for f in files if os.path.exists(f)]


# files of other projects the docs name on purpose, and why
EXTERNAL = {
    "gsm8k.py": "verl's GSM8K reward function and preprocessing script",
    "math_dataset.py": "verl's MATH preprocessing script",
}


def basenames(root):
    names = set()
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and not d.startswith("build")]
        names.update(files)
    return names


LINK = re.compile(r"\[[^\]]*\]\(([^()\s]+)\)")


def anchor(heading):
    """GitHub's anchor of a heading's text."""
    h = re.sub(r"[`*]", "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors_of(path, cache={}):
    if path not in cache:
        seen, out = {}, set()
        in_code = False
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("```"):
                    in_code = not in_code
                m = re.match(r"#{1,6}\s+(.*)", line) if not in_code else None
                if m:
                    a = anchor(m.group(1))
                    n = seen.get(a, 0)
                    seen[a] = n + 1
                    out.add(a if n == 0 else f"{a}-{n}")
        cache[path] = out
    return cache[path]


def check_links(root, f, lineno, line):
    bad = []
    for m in LINK.finditer(line):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue  # a web address, mailto:
        path, _, frag = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
        where = f"{os.path.relpath(f, root)}:{lineno}"
        if not os.path.exists(full):
            bad.append(f"{where}: link to {target}: no file {os.path.relpath(full, root)}")
        elif frag and full.endswith(".md") and frag not in anchors_of(full):
            bad.append(f"{where}: link to {target}: no heading #{frag} in {os.path.relpath(full, root)}")
    return bad


def check(root):
    missing = []
    names = basenames(root)
    for f in doc_files(root):
        with open(f, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                missing += check_links(root, f, lineno, line)
                for m in PATH.finditer(line):
                    raw = m.group(1).rstrip(".,;:")
                    if raw.endswith("/") and raw.count("/") == 1 and raw[:-1] in TOP:
                        continue  # a top-level folder itself
                    for p in expand(raw):
                        p = p.rstrip("/")
                        full = os.path.join(root, p)
                        ok = glob.glob(full) if any(c in p for c in "*?[") else os.path.exists(full)
                        if not ok and os.path.basename(p) + ".c" in names:
                            ok = True  # a program built from that source (ninja -C build ctl/grpod_bench)
                        if not ok:
                            missing.append(f"{os.path.relpath(f, root)}:{lineno}: {p} does not exist")
                for m in BARE.finditer(line):
                    if m.group(1) not in names and m.group(1) not in EXTERNAL:
                        missing.append(f"{os.path.relpath(f, root)}:{lineno}: no file {m.group(1)} in the tree")
    return missing


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    missing = check(root)
    for m in missing:
        print(m, file=sys.stderr)
    if missing:
        print(f"check_doc_paths: {len(missing)} path(s) named in the docs do not exist", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
