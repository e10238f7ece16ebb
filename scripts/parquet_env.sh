#!/usr/bin/env bash
# A Python virtual environment with pyarrow, for scripts/parquet_to_jsonl.py
# (grpo-worker converts verl's parquet datasets with it). Debian has no Arrow
# library, so pyarrow comes from PyPI, pinned. Prints the venv's python.
#
#   scripts/parquet_env.sh      -> ${GRPO_PARQUET_VENV:-~/.cache/grpo/parquet-venv}/bin/python
#
# Created once; a second run only checks that pyarrow imports (quiet, fast).
# Exit 1 with the reason on stderr when the venv cannot be made (no
# python3-venv, no network).
set -euo pipefail
pin=19.0.1 # wheels for CPython 3.9-3.13 on manylinux x86_64 and aarch64; needs no numpy
venv="${GRPO_PARQUET_VENV:-$HOME/.cache/grpo/parquet-venv}"
py="$venv/bin/python"

have() { [ -x "$py" ] && "$py" -c "import sys, pyarrow.parquet; sys.exit(pyarrow.__version__ != '$pin')" 2>/dev/null; }

if have; then
    echo "$py"
    exit 0
fi
mkdir -p "$(dirname "$venv")"
# two runs at once (parallel tests) would race on pip: the second waits for the first, then finds it done
exec 9>"$venv.lock"
flock 9
if ! have; then
    echo "parquet_env: installing pyarrow==$pin into $venv (once)" >&2
    log="$(mktemp)"
    trap 'rm -f "$log"' EXIT
    if ! { [ -x "$py" ] || python3 -m venv "$venv"; } >"$log" 2>&1 ||
        ! "$py" -m pip install --disable-pip-version-check -q "pyarrow==$pin" >>"$log" 2>&1 || ! have; then
        tail -5 "$log" >&2
        echo "parquet_env: could not install pyarrow==$pin into $venv (python3-venv missing, or no network?)" >&2
        exit 1
    fi
fi
echo "$py"
