#!/usr/bin/env bash
# Configure (once) and build into a build directory; incremental afterwards.
#   scripts/build.sh [BUILDDIR] [extra meson setup args...]
# GRPO_BUILD_JOBS=N: at most N compile jobs at once (ninja -j N; default: ninja's, the cores + 2)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build}"
shift || true
args=("$@")
if [ -n "${CI:-}" ]; then
    args+=(-Dwerror=true)
fi
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "${args[@]}" >&2
elif [ ${#args[@]} -gt 0 ]; then
    meson configure "$dir" "${args[@]}" >/dev/null
fi
ninja -C "$dir" ${GRPO_BUILD_JOBS:+-j "$GRPO_BUILD_JOBS"} >&2
