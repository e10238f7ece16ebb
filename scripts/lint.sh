#!/usr/bin/env bash
# Static checks the code passes: clang-format (no diff), clang-tidy (.clang-tidy), no key name retyped in a
# message (scripts/check_key_names.py) and cppcheck (.cppcheck-suppressions), on the project's C sources.
#   scripts/lint.sh            all three
#   scripts/lint.sh --fix      reformat in place first
set -euo pipefail
cd "$(dirname "$0")/.."
# the build's compile database (and generated headers) first; GRPO_LINT_BUILT=1: the caller has built it and may be
# building again beside this script (.ci/run), which then reads a copy of the database taken at its start
if [ "${GRPO_LINT_BUILT:-0}" != 1 ]; then
    ./scripts/build.sh build >/dev/null 2>&1 || ./scripts/build.sh build
fi
mapfile -t files < <(git ls-files '*.c' '*.h' | grep -v '^tests/fixtures/')
if [ "${1:-}" = "--fix" ]; then
    clang-format -i "${files[@]}"
fi
rc=0
echo "clang-format: ${#files[@]} files"
clang-format --dry-run -Werror "${files[@]}" || rc=1
# the libFuzzer harnesses are built by tests/fuzz/run_fuzz.sh with clang, not by meson: they are not in
# build/compile_commands.json, so they get the include paths that script gives them
mapfile -t csrc < <(printf '%s\n' "${files[@]}" | grep '\.c$' | grep -v '^tests/fuzz/')
mapfile -t fuzz < <(printf '%s\n' "${files[@]}" | grep '^tests/fuzz/.*\.c$')
echo "clang-tidy: ${#csrc[@]} files, and ${#fuzz[@]} fuzz harnesses"
pb="$(dirname "$(find build/proto -name grpo.pb-c.h | head -1)")"
# one clang-tidy per core, 8 files each (one process over every file took about 10 of CI's minutes on one core);
# each batch's findings in a file of its own, so that parallel batches do not interleave their lines
jobs="$(getconf _NPROCESSORS_ONLN)" # the cores (nproc would count OMP_NUM_THREADS)
tidy_out="$(mktemp -d)"
trap 'rm -rf "$tidy_out"' EXIT
db="$tidy_out/db"
mkdir "$db"
cp build/compile_commands.json "$db/"
# cppcheck's copy beside the original: it names files relative to its project file, as the suppressions do
cp build/compile_commands.json build/compile_commands.lint.json
printf '%s\0' "${csrc[@]}" | xargs -0 -n 8 -P "$jobs" sh -c \
    'clang-tidy -p "$0/db" --quiet "$@" >"$0/$$.txt" 2>/dev/null || true' "$tidy_out"
if [ ${#fuzz[@]} -gt 0 ]; then
    clang-tidy --quiet "${fuzz[@]}" -- -I. -Ibuild -I"$pb" -D_GNU_SOURCE -std=c17 \
        $(pkg-config --cflags libprotobuf-c jansson) >"$tidy_out/fuzz.txt" 2>/dev/null || true
fi
tidy="$(cat "$tidy_out"/*.txt)"
if grep -E "warning:|error:" <<<"$tidy"; then rc=1; fi
echo "key names in messages (scripts/check_key_names.py)"
python3 scripts/check_key_names.py || rc=1
# a check's status read after a command substitution in its own message is the substitution's (bash expands the
# words in order): such an expect passes whatever came before it. Take the status first: st=$?; expect ... "$st"
echo "test checks whose status is a message's command substitution's"
if git grep -nE 'expect "[^"]*[$][(][^(][^"]*" [$][?]' -- '*.sh'; then
    echo "lint: the checks above read \$? after a \$(...) in their message: take it first (st=\$?; expect \"...\" \"\$st\")"
    rc=1
fi
echo "cppcheck"
cppcheck -j "$jobs" --quiet --error-exitcode=1 --std=c11 --enable=warning,performance,portability \
    --inline-suppr --suppressions-list=.cppcheck-suppressions -D_GNU_SOURCE -I . \
    --project=build/compile_commands.lint.json --file-filter='*.c' -i build || rc=1
[ $rc -eq 0 ] && echo "lint: clean"
exit $rc
