#!/usr/bin/env python3
"""Find configuration key names retyped in messages: a key's dotted name ("data.train_files") written inside a string
literal of a message call (log_*, error_set, check_failf, fprintf, snprintf, ...) instead of taken from the key table
(common/config_keys.def) with KEY_field (the build's common/config_key_names.h, generated from the table), which a renamed key renames too.

    scripts/check_key_names.py [ROOT] [--list] [--max N]

Prints the count (and with --list each one as FILE:LINE: KEY). Exit 1 when more than N remain (default: the debt
recorded in DEBT below, which may only go down), 0 otherwise.
"""
import os
import re
import subprocess
import sys

# message calls: a key named in one of their string literals is a message naming it
CALLS = ("log_info", "log_warn", "log_error", "log_debug", "error_set", "check_failf", "fprintf", "printf",
         "snprintf", "fail", "yfail", "fail_at", "ifail", "tree_fail", "report_failure", "die")
# the folders checked (tests, benches and the key table's own files are not)
FOLDERS = ("common/", "proto/", "kernels/", "worker/", "daemon/", "ctl/")
EXCEPT = ("common/config_keys.def",)
# retyped key names left in messages: lower this as they are converted, never raise it
DEBT = 0

LIT = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
CALL = re.compile(r"\b(" + "|".join(CALLS) + r")\s*\(")


def keys(root):
    text = open(os.path.join(root, "common/config_keys.def"), encoding="utf-8").read()
    return set(re.findall(r'^X\(\w+, "([^"]+)"', text, re.M))


def strip_comments(src):
    """the source with comments blanked (newlines kept), string literals intact"""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def call_spans(src):
    """(start, end) of each message call's argument list"""
    for m in CALL.finditer(src):
        depth, i = 1, m.end()
        while i < len(src) and depth:
            c = src[i]
            if c == '"':
                j = i + 1
                while j < len(src) and src[j] != '"':
                    j += 2 if src[j] == "\\" else 1
                i = j
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            i += 1
        yield m.end(), i


def find(root):
    known = keys(root)
    files = subprocess.run(["git", "-C", root, "ls-files", "*.c", "*.h"], capture_output=True, text=True,
                           check=False).stdout.split()
    if not files:  # not a git tree (a test's): every source under the folders
        for top in FOLDERS:
            for dirpath, _, names in os.walk(os.path.join(root, top)):
                files += [os.path.relpath(os.path.join(dirpath, f), root) for f in names if f.endswith((".c", ".h"))]
    found = []
    for rel in sorted(files):
        if not rel.startswith(FOLDERS) or rel in EXCEPT:
            continue
        src = strip_comments(open(os.path.join(root, rel), encoding="utf-8", errors="replace").read())
        seen = set()
        for a, b in call_spans(src):
            for m in LIT.finditer(src, a, b):
                for k in NAME.findall(m.group(1)):
                    if k in known and (m.start(), k) not in seen:
                        seen.add((m.start(), k))
                        found.append((rel, src.count("\n", 0, m.start()) + 1, k))
    return found


def main():
    args = sys.argv[1:]
    listing = "--list" in args
    limit = DEBT
    if "--max" in args:
        i = args.index("--max")
        limit = int(args[i + 1])
        del args[i:i + 2]
    args = [a for a in args if a != "--list"]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    found = find(root)
    if listing:
        for rel, line, k in found:
            print(f"{rel}:{line}: {k}")
    print(f"check_key_names: {len(found)} key name(s) retyped in messages (KEY_field takes them from "
          f"common/config_keys.def); at most {limit} allowed", file=sys.stderr)
    if len(found) > limit:
        fields = {name: field for field, name in re.findall(r'^X\((\w+), "([^"]+)"',
                                                              open(os.path.join(root, "common/config_keys.def"),
                                                                   encoding="utf-8").read(), re.M)}
        for rel, line, k in [] if listing else found:
            print(f"{rel}:{line}: \"{k}\" retyped in a message: write KEY_{fields[k]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
