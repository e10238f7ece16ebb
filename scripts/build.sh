#!/usr/bin/env bash
# Configure (once) and build into a build directory; incremental afterwards.
#   scripts/build.sh [BUILDDIR] [extra meson setup args...]
# GRPO_BUILD_JOBS=N: at most N compile jobs at once (ninja -j N; default: ninja's, the cores + 2)
# GRPO_BUILD_SUITES="SUITE ...": only what the tests of those meson suites need (scripts/suite_targets.py), less
#   the tests of GRPO_BUILD_NO_SUITES="SUITE ..."; run them with `meson test --no-rebuild` (default: every target)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build}"
shift || true
args=("$@")
if [ -n "${CI:-}" ]; then
    args+=(-Dwerror=true)
fi
# the options last given, kept beside the build: `meson configure` again with the same ones would still make ninja
# regenerate the build files (and rewrite compile_commands.json under a lint that reads it)
given="$dir/.grpo-build-options"
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "${args[@]}" >&2
elif [ ${#args[@]} -gt 0 ] && [ "$(cat "$given" 2>/dev/null)" != "${args[*]}" ]; then
    meson configure "$dir" "${args[@]}" >/dev/null
fi
printf '%s' "${args[*]}" >"$given"
targets=()
if [ -n "${GRPO_BUILD_SUITES:-}" ]; then
    ninja -C "$dir" build.ninja >&2 # meson's records of the tests brought up to date first (a meson.build changed)
    mapfile -t targets < <(python3 scripts/suite_targets.py "$dir" "$GRPO_BUILD_SUITES" "${GRPO_BUILD_NO_SUITES:-}")
    [ ${#targets[@]} -gt 0 ] || { echo "build.sh: no targets for the suites $GRPO_BUILD_SUITES" >&2; exit 1; }
fi
ninja -C "$dir" ${GRPO_BUILD_JOBS:+-j "$GRPO_BUILD_JOBS"} "${targets[@]}" >&2
