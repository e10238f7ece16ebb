#!/usr/bin/env python3
"""Print every key of verl's trainer configuration, one dotted name a line, sorted.

usage: verl_schema_keys.py VERL_GIT_DIR TAG > tests/fixtures/verl/keys-TAG.txt

It reads, at TAG, the two flattened schemas verl generates from its config tree
(verl/trainer/config/_generated_ppo_trainer.yaml and _generated_ppo_megatron_trainer.yaml) and the DAPO
recipe's additions (recipe/dapo/config/dapo_*trainer.yaml). A mapping is walked down to its leaves; a list
or a scalar is a leaf; an empty mapping ({}) is written NAME.* (a map users fill with '+NAME.key=value').
Hydra's own blocks (hydra, defaults) are skipped.
"""
import subprocess
import sys

import yaml

FILES = [
    "verl/trainer/config/_generated_ppo_trainer.yaml",
    "verl/trainer/config/_generated_ppo_megatron_trainer.yaml",
    "recipe/dapo/config/dapo_trainer.yaml",
    "recipe/dapo/config/dapo_megatron_trainer.yaml",
]
SKIP = {"hydra", "defaults"}


def leaves(node, prefix, out):
    if isinstance(node, dict) and not node and prefix:
        out.add(prefix + ".*")
    elif isinstance(node, dict):
        for k, v in node.items():
            if not prefix and k in SKIP:
                continue
            leaves(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif prefix:
        out.add(prefix)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    gitdir, tag = sys.argv[1], sys.argv[2]
    keys = set()
    for f in FILES:
        text = subprocess.run(["git", "--git-dir", gitdir, "show", f"{tag}:{f}"], check=True,
                              capture_output=True, text=True).stdout
        leaves(yaml.safe_load(text), "", keys)
    print(f"# verl {tag}: every key of {', '.join(FILES)} (scripts/verl_schema_keys.py)")
    for k in sorted(keys):
        print(k)


if __name__ == "__main__":
    main()
