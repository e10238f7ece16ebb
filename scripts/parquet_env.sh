#!/usr/bin/env bash
# A Python virtual environment with pyarrow, for scripts/parquet_to_jsonl.py
# (grpo-worker converts verl's parquet datasets with it). Debian has no Arrow
# library, so pyarrow comes from PyPI, pinned. Prints the venv's python.
#
#   scripts/parquet_env.sh [--no-install]   -> ${GRPO_PARQUET_VENV:-~/.cache/grpo/parquet-venv}/bin/python
#
# Created once (scripts/venv_pin.sh); a second run only checks that pyarrow imports (quiet, fast). Exit 1 with
# the reason on stderr when the venv cannot be made (no python3-venv, no network), or with --no-install when it
# is not there.
# pyarrow 19.0.1: wheels for CPython 3.9-3.13 on manylinux x86_64 and aarch64; needs no numpy
exec "$(dirname "$0")/venv_pin.sh" "${GRPO_PARQUET_VENV:-$HOME/.cache/grpo/parquet-venv}" pyarrow==19.0.1 \
    pyarrow.parquet "$@"
