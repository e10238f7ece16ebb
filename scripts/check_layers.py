#!/usr/bin/env python3
"""Check the include layering of the C sources: which folder may include which.

    scripts/check_layers.py [ROOT] [--stamp FILE]     exit 0 when every rule holds, 1 (naming each offending line) otherwise

The rules keep the architecture that docs/ARCHITECTURE.md draws: the daemon, the control client, the kernels, the
protocol and the shared base never include the worker; the trainer library includes none of the step sources that
feed it (worker/hybrid: one process and colocated ranks; worker/split: rollout ranks) nor the split-run protocol;
the trainer and the rollout role never include each other (both build on worker/step, the neutral home of a step's
data, and on worker/gen); a step's data, the scorers, generation and the split-run protocol depend on no role; the
launch depends on no role and reaches MPI only through worker/comm; agents and tools (worker/agent) use the
tokenizer and common/ only, and generation, the trainer and the model never include them. Inside the model
(worker/model): no file includes a kernel back-end (kernels.h is its interface), the model's own files never include
LoRA's headers (an adapter is a projection hook, struct model_hook, that lora.c installs), only the expert block
(model_moe.c) includes expert parallelism's moe_ep.h, and no include cycle runs among its rooms (a source with its
header and its _internal.h header).

Below those, every folder of worker/ and kernels/ is a layer with the list of the folders of worker/ and kernels/ it
may include (DEPENDS; a folder always includes its own files): the kernel interface (kernels/'s own files) includes
no back-end (back-ends register themselves, struct kbackend), a back-end includes the interface and no other
back-end, and no folder above the kernels includes a back-end. A folder of worker/ or kernels/ with sources and no
entry in DEPENDS fails the check too: a new folder states its layer.
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
    ("worker/trainer/", ("worker/rollout/", "worker/hybrid/", "worker/split/", "worker/agent/", "worker/plane/"),
     "the trainer is a library fed by step sources (struct trainer_source): it includes no source (worker/hybrid/, "
     "worker/split/), no role and no protocol"),
    ("worker/rollout/", ("worker/trainer/", "worker/hybrid/", "worker/split/"),
     "the rollout role includes no other role"),
    ("worker/hybrid/", ("worker/rollout/", "worker/split/"),
     "the generating sources (one process, colocated) build on the trainer, never on the rollout role or the split "
     "source"),
    ("worker/split/", ("worker/rollout/", "worker/hybrid/"),
     "the split source (the trainer role of a split run) builds on the trainer and the protocol, never on the rollout "
     "role or the generating sources"),
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
    ("worker/model/", ("kernels/cpu/", "kernels/cuda/"), "the model runs on the kernels' interface (kernels/kernels.h), "
     "never on a back-end"),
    ("worker/launch/", ("worker/trainer/", "worker/rollout/", "worker/hybrid/", "worker/gen/", "worker/plane/",
                        "worker/step/",
                        "common/check_mpi.h"),
     "the launch builds a role's environment over comm_* only: no role's code, no raw MPI"),
]
# headers a folder (or a file) may include although their folder is banned to it: the interfaces it implements
ALLOWED = {"worker/agent/": ("worker/gen/turn_env.h",)}
# Every folder of worker/ and kernels/, as a layer: (the folders of worker/ and kernels/, or single headers, it may
# include besides its own files, why). "kernels/*" and "worker/*" are the files directly in kernels/ (the kernel
# interface, kernels.h) and in worker/ (the binaries' mains and roles.h); a folder is "worker/model/" with every
# file under it.
KERNELS_IF = "kernels/*"
ROLES_H = "worker/roles.h"
DEPENDS = {
    "kernels/*": ((), "the kernel interface includes no back-end: each back-end registers itself (struct kbackend)"),
    "kernels/cpu/": ((KERNELS_IF,), "a kernel back-end implements the interface (kernels.h) and includes no other "
                     "back-end"),
    "kernels/cuda/": ((KERNELS_IF,), "a kernel back-end implements the interface (kernels.h) and includes no other "
                      "back-end"),
    "worker/flight/": ((), "the flight recorder is the worker's floor: common/ only (and proto/names.h's phase "
                       "names); every folder that waits records into it"),
    "worker/watchdog/": (("worker/flight/",), "the progress watchdog reads the flight recorder's dumps (and the hang "
                         "verdict, proto/hang.h); the trainer and the launch call it"),
    "worker/comm/": (("worker/flight/",), "the collective plane is the worker's bottom: common/ and the flight "
                     "recorder only (its back-ends register, struct comm_device_backend)"),
    "worker/formats/": ((), "the file formats are the worker's bottom: common/ only"),
    "worker/metrics/": ((), "the metrics are the worker's bottom: common/ only"),
    "worker/tokenizer/": (("worker/formats/",), "the tokenizer builds on the file formats only"),
    "worker/model/": ((KERNELS_IF, "worker/comm/", "worker/flight/", "worker/formats/"),
                      "the model runs on the kernels' interface (kernels/kernels.h), never on a back-end, over the "
                      "collective plane and the file formats"),
    "worker/data/": (("worker/tokenizer/", "worker/formats/"), "the datasets build on the tokenizer and the formats"),
    "worker/control/": (("worker/flight/", "worker/metrics/"),
                        "the control plane builds on the metrics and the flight recorder only"),
    "worker/plan/": ((KERNELS_IF, "worker/model/", "worker/formats/"), "the planner builds on the model"),
    "worker/step/": ((KERNELS_IF, "worker/data/", "worker/formats/", "worker/metrics/", "worker/model/",
                      "worker/tokenizer/"), "a step's data builds on the model, the data and the tokenizer"),
    "worker/rewards/": ((KERNELS_IF, "worker/formats/", "worker/model/", "worker/step/", "worker/tokenizer/"),
                        "the scorers build on a step's data and the model (reward models)"),
    "worker/gen/": ((KERNELS_IF, "worker/comm/", "worker/metrics/", "worker/model/", "worker/rewards/", "worker/step/",
                     "worker/tokenizer/"), "generation builds on the model, a step's data and the scorers (and on the "
                    "collective plane where a group of ranks generates as one engine)"),
    "worker/plane/": ((KERNELS_IF, "worker/comm/", "worker/flight/", "worker/step/", "worker/metrics/"),
                      "the split-run protocol builds on a step's data and the collective plane"),
    "worker/agent/": (("worker/tokenizer/", "worker/gen/turn_env.h"),
                      "agents and tools build on the tokenizer and generation's turn interface"),
    "worker/launch/": ((KERNELS_IF, ROLES_H, "worker/comm/", "worker/control/", "worker/flight/", "worker/metrics/",
                        "worker/watchdog/"),
                       "the launch builds a role's environment over the collective and control planes"),
    "worker/trainer/": ((KERNELS_IF, ROLES_H, "worker/comm/", "worker/control/", "worker/data/", "worker/flight/",
                         "worker/formats/",
                         "worker/gen/", "worker/metrics/", "worker/model/", "worker/rewards/", "worker/step/",
                         "worker/tokenizer/", "worker/watchdog/"),
                        "the trainer library builds on every capability below but the split-run protocol, and knows no "
                        "step source"),
    "worker/split/": ((KERNELS_IF, ROLES_H, "worker/comm/", "worker/control/", "worker/data/", "worker/formats/",
                       "worker/gen/", "worker/metrics/", "worker/model/", "worker/plane/", "worker/rewards/",
                       "worker/step/", "worker/survive/", "worker/tokenizer/", "worker/trainer/"),
                      "the split source (the trainer role of a split run) builds on the trainer library, the "
                      "split-run protocol and trainer-loss survival"),
    "worker/rollout/": ((KERNELS_IF, ROLES_H, "worker/comm/", "worker/control/", "worker/data/", "worker/flight/",
                         "worker/formats/",
                         "worker/gen/", "worker/metrics/", "worker/model/", "worker/plane/", "worker/rewards/",
                         "worker/step/", "worker/tokenizer/"), "the rollout role builds on every capability below"),
    "worker/survive/": ((ROLES_H, "worker/comm/", "worker/trainer/"),
                        "trainer-loss survival drives the trainer library (its recovery hooks) over the collective "
                        "plane's fault tolerance; the colocated role and the split source use it"),
    "worker/hybrid/": ((KERNELS_IF, ROLES_H, "worker/comm/", "worker/control/", "worker/data/", "worker/formats/",
                        "worker/gen/", "worker/metrics/", "worker/model/", "worker/plane/", "worker/rewards/",
                        "worker/step/", "worker/survive/", "worker/tokenizer/", "worker/trainer/"),
                       "the colocated role builds on the trainer role and every capability below"),
    "worker/*": ((KERNELS_IF, "worker/"), "the binaries' mains (grpo-worker, grpo-model) run the roles and tools, "
                 "on the kernels' interface, never on a back-end"),
}
# Between the files of one folder: (files checked: paths starting with one of these, files excepted, headers they
# must not include (as resolved from the tree's root), why). A bare include ("lora.h") is the including file's
# folder's, as the compiler finds it.
FILE_RULES = [
    (("worker/model/",), ("worker/model/lora",), ("worker/model/lora.h", "worker/model/lora_internal.h"),
     "the model calls its projection hook (struct model_hook) and knows no adapter: lora.c installs LoRA's"),
    (("worker/model/",), ("worker/model/model_moe.c", "worker/model/moe_ep."), ("worker/model/moe_ep.h",),
     "expert parallelism sits behind the expert block: only model_moe.c dispatches over the EP group"),
]
# folders whose rooms (a source with its header and its _internal.h header) include each other in no cycle
CYCLE_FREE = ["worker/model/"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = (".c", ".h", ".cu", ".cuh")


def includes(root, folder):
    """(path from root, line, the include as written, the included file's path from root) of a folder's sources"""
    base = os.path.join(root, folder)
    if not os.path.isdir(base):
        return
    for dirpath, _, names in os.walk(base):
        for name in sorted(names):
            if not name.endswith(SOURCES):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    near = os.path.normpath(os.path.join(os.path.dirname(rel), inc))
                    here = "/" not in inc or os.path.exists(os.path.join(root, near))
                    yield rel, lineno, inc, near if here else inc


def layer(path):
    """the DEPENDS key of a file of worker/ or kernels/: its folder below them, or "worker/*", "kernels/*" for their
    own files; None elsewhere"""
    parts = path.split("/")
    if parts[0] not in ("worker", "kernels") or len(parts) < 2:
        return None
    return parts[0] + "/*" if len(parts) == 2 else parts[0] + "/" + parts[1] + "/"


def layers(root):
    """(the DEPENDS keys of every folder of worker/ and kernels/ that holds sources, any source path of it)"""
    seen = {}
    for top in ("worker", "kernels"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if name.endswith(SOURCES):
                    rel = os.path.relpath(os.path.join(dirpath, name), root)
                    seen.setdefault(layer(rel), rel)
    return seen


def depends_ok(key, target):
    """whether a file of layer key may include target (a path from the root)"""
    tkey = layer(target)
    if tkey is None or tkey == key:
        return True
    for a in DEPENDS[key][0]:
        if a in (target, tkey) or (a == "worker/" and tkey.startswith("worker/")):
            return True
    return False


def allowed(rel, inc):
    return any(rel.startswith(k) and inc in v for k, v in ALLOWED.items())


def room(path):
    """a source, its header and its _internal.h header: one room"""
    stem = os.path.splitext(path)[0]
    return stem[:-len("_internal")] if stem.endswith("_internal") else stem


def cycles(root, folder):
    edges = {}
    where = {}
    for rel, lineno, inc, target in includes(root, folder):
        a, b = room(rel), room(target)
        if a != b and target.startswith(folder) and os.path.exists(os.path.join(root, target)):
            edges.setdefault(a, set()).add(b)
            where.setdefault((a, b), f"{rel}:{lineno}: includes \"{inc}\"")
    bad, state = [], {}

    def visit(a, path):
        state[a] = 1
        for b in sorted(edges.get(a, ())):
            if state.get(b) == 1:
                loop = path[path.index(b):] + [b]
                bad.append(where[(a, b)] + ": closes an include cycle among " + folder + "'s rooms: " +
                           " -> ".join(os.path.basename(r) for r in loop))
            elif not state.get(b):
                visit(b, path + [b])
        state[a] = 2

    for a in sorted(edges):
        if not state.get(a):
            visit(a, [a])
    return bad


def check(root):
    bad = []
    for folder, banned, why in RULES:
        for rel, lineno, inc, _ in includes(root, folder):
            if inc.startswith(banned) and not allowed(rel, inc):
                bad.append(f"{rel}:{lineno}: includes \"{inc}\": {why}")
    for checked, excepted, banned, why in FILE_RULES:
        for folder in checked:
            for rel, lineno, inc, target in includes(root, folder):
                if target in banned and not rel.startswith(excepted):
                    bad.append(f"{rel}:{lineno}: includes \"{inc}\": {why}")
    for key, rel in sorted(layers(root).items()):
        if key not in DEPENDS:
            bad.append(f"{rel}: {key} has no layer (scripts/check_layers.py DEPENDS): every folder of worker/ and "
                       "kernels/ states what it may include")
    for top in ("worker/", "kernels/"):
        for rel, lineno, inc, target in includes(root, top):
            key = layer(rel)
            if key in DEPENDS and not depends_ok(key, target):
                may = ", ".join(DEPENDS[key][0]) or "nothing of worker/ and kernels/"
                bad.append(f"{rel}:{lineno}: includes \"{inc}\": {key} may include {may} ({DEPENDS[key][1]})")
    for folder in CYCLE_FREE:
        bad += cycles(root, folder)
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
