#!/usr/bin/env python3
"""Count test results from meson's JSON test logs and print 'N passed, N failed, N skipped'.

usage: count_tests.py BUILDDIR/meson-logs/testlog.json [...]
Exit status 1 when any test failed (or timed out) or no test ran. Before the count, the ten tests that took
longest (where a run's time goes, read from CI's tail).
"""
import json
import sys

passed = failed = skipped = 0
names_failed = []
durations = []
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            result = rec.get("result", "")
            build = path.split("/meson-logs/")[0].rsplit("/", 1)[-1]
            durations.append((float(rec.get("duration") or 0), f"{build}: {rec.get('name')}"))
            if result in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif result == "SKIP":
                skipped += 1
            else:
                failed += 1
                names_failed.append(f"{rec.get('name')} ({result})")
if durations:
    total = sum(d for d, _ in durations)
    print(f"the tests' own time, {total:.0f} s in all; the longest:")
    for d, n in sorted(durations, reverse=True)[:10]:
        print(f"  {d:6.0f} s  {n}")
for n in names_failed:
    print(f"FAILED: {n}")
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or passed == 0 else 0)
