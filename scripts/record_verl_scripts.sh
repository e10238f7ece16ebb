#!/usr/bin/env bash
# Record the argument vectors of verl's GRPO launch scripts (examples/grpo_trainer/*.sh and recipe/dapo/*.sh at a
# tag) as bash delivers them, into tests/fixtures/verl/scripts/DIR__NAME.args (one argument a line).
# Each script runs with stand-ins first on PATH: python3/python record "python3 -m verl.trainer.*|recipe.*"'s
# arguments and do nothing else; ray passes "ray job submit ... -- CMD" on to CMD; hf, wandb, nvidia-smi, pip do
# nothing. HOME is /home/user. Lines that source a vendor toolkit or copy model files are skipped (said below).
# usage: scripts/record_verl_scripts.sh VERL_GIT_DIR TAG OUT_DIR
set -eu
git_dir="$1" tag="$2" out="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/src" "$out"
cat >"$work/bin/python3" <<'PY'
#!/bin/bash
for a in "$@"; do case "$a" in verl.trainer.*|recipe.*) printf '%s\0' "$@" >"$REC_OUT"; exit 0;; esac; done
exit 0
PY
cp "$work/bin/python3" "$work/bin/python"
cat >"$work/bin/ray" <<'RAY'
#!/bin/bash
while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done
[ $# -gt 0 ] && shift
[ $# -gt 0 ] && exec "$@"
exit 0
RAY
for s in huggingface-cli hf wandb nvidia-smi pip pip3 modelscope; do printf '#!/bin/bash\nexit 0\n' >"$work/bin/$s"; done
chmod +x "$work/bin"/*
git --git-dir="$git_dir" archive "$tag" examples/grpo_trainer recipe/dapo | tar -x -C "$work/src"
for f in "$work"/src/examples/grpo_trainer/*.sh "$work"/src/recipe/dapo/run_*.sh "$work"/src/recipe/dapo/test_*.sh; do
    dir="$(basename "$(dirname "$f")")"
    name="${dir}__$(basename "$f" .sh)"
    sed -E 's#^(source /usr/local/Ascend.*|cp /models.*)$#: skipped \1#' "$f" >"$work/script.sh"
    grep -q '^: skipped' "$work/script.sh" && echo "$name: vendor set-up lines skipped" >&2
    (cd "$work/src" && HOME=/home/user RAY_DATA_HOME=/home/user/verl PATH="$work/bin:$PATH" REC_OUT="$work/rec" \
        timeout 20 bash "$work/script.sh" >/dev/null 2>&1) || true
    if [ -s "$work/rec" ]; then
        { echo "# verl $tag $dir/$(basename "$f"): its python3 argument vector as bash delivers it, one argument a line (HOME=/home/user)"
          tr '\0' '\n' <"$work/rec"; } >"$out/$name.args"
    else
        echo "$name: no python3 -m verl... line reached" >&2
    fi
    rm -f "$work/rec"
done
