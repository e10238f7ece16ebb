#!/usr/bin/env python3
"""Write the key table's names as string macros (the build's common/config_key_names.h):

    scripts/gen_key_names.py common/config_keys.def OUT.h

KEY_field is the dotted name of the key whose field (struct grpo_config's) that is, a string literal that messages
concatenate ("set " KEY_data_train_files " to ..."): a renamed key renames it there, and a message naming a field
that is gone does not compile."""
import re
import sys


def main():
    src, out = sys.argv[1], sys.argv[2]
    keys = re.findall(r'^X\((\w+), "([^"]+)"', open(src, encoding="utf-8").read(), re.M)
    lines = ["/* Generated from common/config_keys.def by scripts/gen_key_names.py: each key's dotted name by its",
             " * field, a string literal for messages: KEY_data_train_files is \"data.train_files\". */",
             "#ifndef GRPO_CONFIG_KEY_NAMES_H", "#define GRPO_CONFIG_KEY_NAMES_H", ""]
    lines += [f'#define KEY_{field} "{name}"' for field, name in keys]
    lines += ["", "#endif", ""]
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
