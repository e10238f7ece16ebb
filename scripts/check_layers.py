#!/usr/bin/env python3
"""Check the include layering of the C sources: which folder may include which.

    scripts/check_layers.py [ROOT] [--stamp FILE]     exit 0 when every rule holds, 1 (naming each offending line) otherwise

The rules keep the architecture that docs/ARCHITECTURE.md draws: the daemon, the control client, the kernels,
the protocol and the shared base never include the worker; the trainer and the rollout role never include each
other (both build on worker/step, the neutral home of a step's data, and on worker/gen and worker/plane); a
step's data, the scorers, generation and the split-run protocol depend on no role; the launch depends on no role
and reaches MPI only through worker/comm; agents and tools (worker/agent) use the tokenizer and common/ only, and
generation, the trainer and the model never include them.
"""
import os
import re
import sys

# (folder whose files are checked, include prefixes they must not use, why)
RULES = [
    ("common/", ("worker/", "daemon/", "ctl/", "kernels/"), "the base layer is shared by every binary"),
    ("proto/", ("worker/", "daemon/", "ctl/"), "the protocol is shared by grpod, grpoctl and the workers"),
    ("kernels/", ("worker/", "daemon/", "ctl/"), "kernels know no worker"),
    ("daemon/", ("worker/", "ctl/"), "grpod depends on proto/ and common/ only"),
    ("ctl/", ("worker/", "daemon/"), "grpoctl depends on proto/ and common/ only"),
    ("worker/trainer/", ("worker/rollout/", "worker/hybrid/", "worker/agent/"),
     "the trainer includes no role built on it, and never the rollout role"),
    ("worker/rollout/", ("worker/trainer/", "worker/hybrid/"), "the rollout role includes no other role"),
    ("worker/hybrid/", ("worker/rollout/",), "the colocated role builds on the trainer, never on the rollout role"),
    ("worker/step/", ("worker/trainer/", "worker/rollout/", "worker/hybrid/", "worker/gen/", "worker/plane/"),
     "a step's data depends on no role, no generation and no protocol"),
    ("worker/rewards/", ("worker/trainer/", "worker/rollout/", "worker/gen/", "worker/plane/"),
     "the scorers depend on no role"),
    ("worker/gen/", ("worker/trainer/", "worker/rollout/", "worker/plane/", "worker/agent/"),
     "generation depends on no role and knows nothing of tools"),
    ("worker/plane/", ("worker/trainer/", "worker/rollout/", "worker/gen/"),
     "the split-run protocol depends on no role"),
    ("worker/agent/", ("worker/trainer/", "worker/rollout/", "worker/hybrid/", "worker/plane/", "worker/gen/",
                       "worker/model/", "worker/step/", "worker/launch/", "worker/comm/", "worker/data/",
                       "worker/rewards/", "worker/metrics/", "worker/control/", "worker/plan/", "worker/formats/",
                       "kernels/"),
     "agents and tools build on the tokenizer and common/ only (and implement generation's turn interface, "
     "worker/gen/turn_env.h)"),
    ("worker/model/", ("worker/agent/",), "the model knows nothing of tools"),
    ("worker/launch/", ("worker/trainer/", "worker/rollout/", "worker/hybrid/", "worker/gen/", "worker/plane/",
                        "worker/step/",
                        "common/check_mpi.h"),
     "the launch builds a role's environment over comm_* only: no role's code, no raw MPI"),
]
# headers a folder may include although their folder is banned to it: the interfaces it implements
ALLOWED = {"worker/agent/": ("worker/gen/turn_env.h",)}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def check(root):
    bad = []
    for folder, banned, why in RULES:
        base = os.path.join(root, folder)
        if not os.path.isdir(base):
            continue
        for dirpath, _, names in os.walk(base):
            for name in sorted(names):
                if not name.endswith((".c", ".h", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if m and m.group(1).startswith(banned) and m.group(1) not in ALLOWED.get(folder, ()):
                            rel = os.path.relpath(path, root)
                            bad.append(f"{rel}:{lineno}: includes \"{m.group(1)}\": {why}")
    return bad


def main():
    args = sys.argv[1:]
    stamp = None
    if "--stamp" in args:  # the build's target: touch the stamp once the check passes
        i = args.index("--stamp")
        stamp = args[i + 1]
        del args[i:i + 2]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    bad = check(root)
    for b in bad:
        print(b, file=sys.stderr)
    if bad:
        print(f"check_layers: {len(bad)} include(s) cross a layer (scripts/check_layers.py lists the rules)",
              file=sys.stderr)
        return 1
    if stamp:
        with open(stamp, "w", encoding="utf-8") as f:
            f.write("layers: ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
