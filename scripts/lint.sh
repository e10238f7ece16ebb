#!/usr/bin/env bash
# Static checks the code passes: clang-format (no diff), clang-tidy (.clang-tidy)
# and cppcheck (.cppcheck-suppressions), on the project's C sources.
#   scripts/lint.sh            all three
#   scripts/lint.sh --fix      reformat in place first
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh build >/dev/null 2>&1 || ./scripts/build.sh build
mapfile -t files < <(git ls-files '*.c' '*.h' | grep -v '^tests/fixtures/')
if [ "${1:-}" = "--fix" ]; then
    clang-format -i "${files[@]}"
fi
rc=0
echo "clang-format: ${#files[@]} files"
clang-format --dry-run -Werror "${files[@]}" || rc=1
mapfile -t csrc < <(printf '%s\n' "${files[@]}" | grep '\.c$')
echo "clang-tidy: ${#csrc[@]} files"
tidy="$(clang-tidy -p build --quiet "${csrc[@]}" 2>/dev/null || true)"
if grep -E "warning:|error:" <<<"$tidy"; then rc=1; fi
echo "cppcheck"
cppcheck --quiet --error-exitcode=1 --std=c11 --enable=warning,performance,portability \
    --inline-suppr --suppressions-list=.cppcheck-suppressions -D_GNU_SOURCE -I . \
    --project=build/compile_commands.json --file-filter='*.c' -i build || rc=1
[ $rc -eq 0 ] && echo "lint: clean"
exit $rc
