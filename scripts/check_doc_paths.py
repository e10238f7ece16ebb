#!/usr/bin/env python3
"""Every path the docs name exists: the README, docs/*.md, deploy/ and bench/ READMEs.

    scripts/check_doc_paths.py [ROOT]    exit 0 when every named path exists, 1 naming each missing one

A bare file name with a source suffix (trainer_step.c, dist_lib.sh) must name a file somewhere in the tree.
A path is a word that starts with one of the tree's top-level folders (common/, worker/, tests/, ...) and names
a file or folder of the source tree. Globs (tests/system/*.sh) must match something; brace lists
(worker/plane/{wire,dataplane}.c) are expanded; a folder may end in '/'.
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


def check(root):
    missing = []
    names = basenames(root)
    for f in doc_files(root):
        with open(f, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
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
