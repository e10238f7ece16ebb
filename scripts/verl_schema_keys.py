#!/usr/bin/env python3
"""Print every key of verl's trainer configuration, one dotted name a line, sorted.

usage: verl_schema_keys.py VERL_GIT_DIR TAG [RECIPE_GIT_DIR] > tests/fixtures/verl/keys-TAG.txt

It reads, at TAG, the flattened schemas verl generates from its config tree (verl/trainer/config/
_generated_ppo_*trainer.yaml: the FSDP and Megatron trainers, from v0.9 the TorchTitan and VeOmni ones too), the
configs of its asynchronous trainers where the tag has them under verl/experimental (fully_async_policy,
one_step_off_policy: their own blocks, over the PPO trainer's) and the DAPO recipe's additions
(recipe/dapo/config/dapo_*trainer.yaml). From v0.8 recipe/ is a git submodule (verl-recipe): its files are read
from RECIPE_GIT_DIR at the commit TAG pins. A mapping is walked down to its leaves; a list or a scalar is a leaf;
an empty mapping ({}) is written NAME.* (a map users fill with '+NAME.key=value'). Hydra's own blocks (hydra,
defaults) are skipped.
"""
import subprocess
import sys

import yaml

FILES = {
    "v0.7.0": [
        "verl/trainer/config/_generated_ppo_trainer.yaml",
        "verl/trainer/config/_generated_ppo_megatron_trainer.yaml",
        "recipe/dapo/config/dapo_trainer.yaml",
        "recipe/dapo/config/dapo_megatron_trainer.yaml",
    ],
    "v0.9.0": [
        "verl/trainer/config/_generated_ppo_trainer.yaml",
        "verl/trainer/config/_generated_ppo_megatron_trainer.yaml",
        "verl/trainer/config/_generated_ppo_torchtitan_trainer.yaml",
        "verl/trainer/config/_generated_ppo_veomni_trainer.yaml",
        "verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml",
        "verl/experimental/fully_async_policy/config/fully_async_ppo_megatron_trainer.yaml",
        "verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml",
        "verl/experimental/one_step_off_policy/config/one_step_off_ppo_megatron_trainer.yaml",
        "recipe/dapo/config/dapo_trainer.yaml",
        "recipe/dapo/config/dapo_megatron_trainer.yaml",
    ],
}
SKIP = {"hydra", "defaults"}


def git(gitdir, *args):
    return subprocess.run(["git", "--git-dir", gitdir, *args], check=True, capture_output=True, text=True).stdout


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


def recipe_commit(gitdir, tag):
    """The verl-recipe commit TAG pins when recipe/ is a submodule there, else None."""
    entry = git(gitdir, "ls-tree", tag, "recipe").split()
    return entry[2] if entry and entry[1] == "commit" else None


def main():
    if len(sys.argv) not in (3, 4) or sys.argv[2] not in FILES:
        sys.exit(__doc__ + f"\nknown tags: {', '.join(FILES)}")
    gitdir, tag = sys.argv[1], sys.argv[2]
    recipe_dir = sys.argv[3] if len(sys.argv) == 4 else None
    pinned = recipe_commit(gitdir, tag)
    keys, names = set(), []
    for f in FILES[tag]:
        if f.startswith("recipe/") and pinned:
            if not recipe_dir:
                sys.exit(f"verl {tag}: recipe/ is a submodule (verl-recipe {pinned[:7]}): give RECIPE_GIT_DIR")
            text = git(recipe_dir, "show", f"{pinned}:{f[len('recipe/'):]}")
            names.append(f"{f} (verl-recipe {pinned[:7]})")
        else:
            text = git(gitdir, "show", f"{tag}:{f}")
            names.append(f)
        leaves(yaml.safe_load(text), "", keys)
    print(f"# verl {tag}: every key of {', '.join(names)} (scripts/verl_schema_keys.py)")
    for k in sorted(keys):
        print(k)


if __name__ == "__main__":
    main()
