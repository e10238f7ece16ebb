#!/usr/bin/env python3
"""No shell in the product: the C and C++ sources of the programs (common, daemon, worker, ctl, kernels) call
neither system() nor popen(), nor exec a shell ("/bin/sh", "sh -c"). File work goes through common/fs (unlinkat
relative to opened directories); child processes are started with an argument vector.

    scripts/check_no_shell.py [ROOT]     exit 1 naming each FILE:LINE and the call
"""
import pathlib
import re
import sys

DIRS = ("common", "daemon", "worker", "ctl", "kernels")
CALL = re.compile(r"\b(system|popen)\s*\(")
SHELL = re.compile(r'"(/bin/sh|/bin/bash|sh|bash)"\s*,\s*"-c"|"/bin/(ba)?sh"')


def strip(text):
    """Comments and the insides of string literals blanked, line breaks kept (so line numbers hold); a string's
    quotes stay, so SHELL still sees a literal "/bin/sh" (checked on the raw line separately)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    bad = []
    for d in DIRS:
        for f in sorted((root / d).rglob("*")):
            if f.suffix not in (".c", ".h", ".cc", ".cu") or not f.is_file():
                continue
            raw = f.read_text(errors="replace")
            code = strip(raw).split("\n")
            for no, (line, rawline) in enumerate(zip(code, raw.split("\n")), 1):
                m = CALL.search(line)
                if m and not re.search(r"(\.|->)\s*$", line[: m.start()]):
                    bad.append(f"{f.relative_to(root)}:{no}: calls {m.group(1)}() (a shell)")
                elif SHELL.search(rawline) and '"' in line:
                    bad.append(f"{f.relative_to(root)}:{no}: runs a shell ({SHELL.search(rawline).group(0)})")
    for b in bad:
        print(b, file=sys.stderr)
    if bad:
        print("no shell in product code: remove files with common/fs (fs_remove_tree), start programs with "
              "an argument vector (posix_spawn, execvp)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
