#!/usr/bin/env bash
# Record the argument vectors of verl's GRPO launch scripts (examples/grpo_trainer/*.sh, recipe/dapo/{run,test}_*.sh
# and, where the tag has them, the fully-async trainer's verl/experimental/fully_async_policy/shell/*.sh) as bash
# delivers them, into OUT_DIR/DIR__NAME.args (one argument a line; DIR is the script's folder, fully_async_policy
# for the fully-async ones). From verl v0.8 recipe/ is a git submodule (verl-recipe): its scripts come from
# RECIPE_GIT_DIR at the commit the tag pins.
# Each script runs with stand-ins first on PATH: python3/python record the arguments of
# "python3 -m verl.trainer.*|verl.experimental.*|recipe.*" and do nothing else, and fail any "python3 -c" probe (so
# "import torch_npu" fails: the GPU branch is taken); ray passes "ray job submit ... -- CMD" on to CMD; date prints
# 2000-01-01 00:00:00 UTC in the format asked; hf, wandb, nvidia-smi, pip do nothing. HOME is /home/user; the model
# and data roots some scripts take from the environment are HDFS_ROOT=/home/user/hdfs and DATA_ROOT=/home/user/data.
# The scripts run from the checkout's root, written /home/user/verl-src where an argument names it ($PWD). Lines
# that source a vendor toolkit or copy model files are skipped (said below).
# usage: scripts/record_verl_scripts.sh VERL_GIT_DIR TAG OUT_DIR [RECIPE_GIT_DIR]
set -eu
git_dir="$1" tag="$2" out="$3" recipe_dir="${4:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/src" "$out"
cat >"$work/bin/python3" <<'PY'
#!/bin/bash
[ "${1:-}" = "-c" ] && exit 1
for a in "$@"; do
    case "$a" in verl.trainer.*|verl.experimental.*|recipe.*) printf '%s\0' "$@" >"$REC_OUT"; exit 0;; esac
done
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
real_date="$(command -v date)"
printf '#!/bin/bash\nexec %s -u -d "2000-01-01 00:00:00" "$@"\n' "$real_date" >"$work/bin/date"
for s in huggingface-cli hf wandb nvidia-smi pip pip3 modelscope; do printf '#!/bin/bash\nexit 0\n' >"$work/bin/$s"; done
chmod +x "$work/bin"/*
paths=(examples/grpo_trainer)
git --git-dir="$git_dir" cat-file -e "$tag:verl/experimental/fully_async_policy/shell" 2>/dev/null &&
    paths+=(verl/experimental/fully_async_policy/shell)
read -r _ kind pinned _ < <(git --git-dir="$git_dir" ls-tree "$tag" recipe) || true
if [ "$kind" = commit ]; then
    if [ -z "$recipe_dir" ]; then
        echo "verl $tag: recipe/ is a submodule (verl-recipe $pinned): give RECIPE_GIT_DIR" >&2
        exit 2
    fi
    mkdir -p "$work/src/recipe"
    git --git-dir="$recipe_dir" archive "$pinned" dapo | tar -x -C "$work/src/recipe"
else
    paths+=(recipe/dapo)
fi
git --git-dir="$git_dir" archive "$tag" "${paths[@]}" | tar -x -C "$work/src"
for f in "$work"/src/examples/grpo_trainer/*.sh "$work"/src/recipe/dapo/run_*.sh "$work"/src/recipe/dapo/test_*.sh \
    "$work"/src/verl/experimental/fully_async_policy/shell/*.sh; do
    [ -e "$f" ] || continue
    rel="${f#"$work"/src/}"
    dir="$(basename "$(dirname "$f")")"
    [ "$dir" = shell ] && dir="$(basename "$(dirname "$(dirname "$f")")")"
    name="${dir}__$(basename "$f" .sh)"
    sed -E 's#^(source /usr/local/Ascend.*|cp /models.*)$#: skipped \1#' "$f" >"$work/script.sh"
    grep -q '^: skipped' "$work/script.sh" && echo "$name: vendor set-up lines skipped" >&2
    (cd "$work/src" && HOME=/home/user RAY_DATA_HOME=/home/user/verl HDFS_ROOT=/home/user/hdfs \
        DATA_ROOT=/home/user/data PATH="$work/bin:$PATH" REC_OUT="$work/rec" \
        timeout 20 bash "$work/script.sh" >/dev/null 2>&1) || true
    if [ -s "$work/rec" ]; then
        where="$dir/$(basename "$f")"
        [ "$dir" = fully_async_policy ] && where="$rel"
        [ "$kind" = commit ] && [ "$dir" = dapo ] &&
            where="recipe/dapo/$(basename "$f") (verl-recipe ${pinned:0:7})"
        { echo "# verl $tag $where: its python3 argument vector as bash delivers it, one argument a line (HOME=/home/user)"
          tr '\0' '\n' <"$work/rec" | sed "s#$work/src#/home/user/verl-src#g"; } >"$out/$name.args"
    else
        echo "$name: no python3 -m verl... line reached" >&2
    fi
    rm -f "$work/rec"
done
