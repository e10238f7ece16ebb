#!/usr/bin/env python3
"""No sleep as synchronisation in the tests: a test waits on an event (a file, a log line, a process's end, a
pidfd, a poll), bounded by a deadline, never on a fixed time. A sleep that is itself what is tested (a fault's
length, a signal sent N seconds after another, a measurement window, a stand-in process that must stay alive,
the poll interval inside a wait) carries `sleep-ok: WHY` on its line or the line above.

    scripts/check_test_sleeps.py [ROOT]     exit 1 naming each FILE:LINE

tests/sleep_debt.txt lists the synchronising sleeps not yet replaced by events ("FILE: the line's text"): they are
known debt, reported but not failed; any other is a failure. Remove a line there when its sleep goes.
"""
import pathlib
import re
import sys

SLEEP = re.compile(r"(^|[^\w.])(sleep\s+[0-9\"$]|u?sleep\s*\(|nanosleep\s*\(|time\.sleep\s*\(|clock_sleep_s\s*\()")
SKIP = ("tests/cuemu/", "tests/unit/test_check.sh")  # the CUDA emulator (not a test); this check's own planted cases


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    debt_file = root / "tests" / "sleep_debt.txt"
    debt = set()
    if debt_file.exists():
        debt = {l.strip() for l in debt_file.read_text().split("\n") if l.strip() and not l.startswith("#")}
    bad, owed = [], []
    for f in sorted((root / "tests").rglob("*")):
        rel = f.relative_to(root).as_posix()
        if not f.is_file() or f.suffix not in (".sh", ".c", ".py", ".h") or rel.startswith(SKIP):
            continue
        lines = f.read_text(errors="replace").split("\n")
        for i, line in enumerate(lines):
            code = line.split("#", 1)[0] if f.suffix in (".sh", ".py") else line.split("//", 1)[0]
            if not SLEEP.search(code):
                continue
            if "sleep-ok:" in line or (i > 0 and "sleep-ok:" in lines[i - 1]):
                continue
            (owed if f"{rel}: {line.strip()}" in debt else bad).append(f"{rel}:{i + 1}: {line.strip()}")
    if owed:
        print(f"{len(owed)} known synchronising sleep(s) still owed (tests/sleep_debt.txt)", file=sys.stderr)
    for b in bad:
        print(b, file=sys.stderr)
    if bad:
        print("a sleep used as synchronisation: wait for the event instead (tests/lib.sh wait_for), or, when the "
              "time itself is what is tested, say so with `sleep-ok: WHY`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
