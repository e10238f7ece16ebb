#!/usr/bin/env python3
"""The build targets that the tests of some meson suites need, as ninja target paths relative to the build
directory: what scripts/build.sh builds when GRPO_BUILD_SUITES is set, so that a build made for a few suites
(the emulator's gpu suite, the sanitizers' unit, system and mpi suites) compiles only their programs.

    scripts/suite_targets.py BUILDDIR "SUITE ..." ["SUITE ..."]

The first list picks the tests (a test in any of those suites), the second drops tests in any of its suites.
A test's needs are meson's own record of them (`depends` in `meson introspect --tests`: its program and the
targets named in its `depends :`), so a test that runs a program must name it there, as every test here does."""
import json
import os
import subprocess
import sys


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    build, want = sys.argv[1], set(sys.argv[2].split())
    skip = set(sys.argv[3].split()) if len(sys.argv) == 4 else set()
    intro = lambda what: json.loads(subprocess.check_output(["meson", "introspect", what, build]))
    tests, targets = intro("--tests"), {t["id"]: t for t in intro("--targets")}
    need = set()
    for t in tests:
        suites = {s.split(":")[-1] for s in t["suite"]}
        if suites & want and not suites & skip:
            need.update(t["depends"])
    root = os.path.realpath(build)
    if not need:
        sys.exit(f"suite_targets: no test of the suites {sorted(want)} in {build}")
    for i in sorted(need):
        for f in targets[i]["filename"]:
            print(os.path.relpath(f, root))


if __name__ == "__main__":
    main()
