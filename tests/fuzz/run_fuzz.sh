#!/usr/bin/env bash
# Build the libFuzzer harness of grpod's parsers with clang and run it for a
# bounded time (default 60 s). Exit 77 (skipped) without clang's libFuzzer.
#
#   tests/fuzz/run_fuzz.sh [SOURCE_ROOT] [SECONDS]
# Crashes are kept in $GRPO_FUZZ_OUT (default: a temporary directory, printed).
set -euo pipefail
src="$(cd "${1:-$(dirname "$0")/../..}" && pwd)"
secs="${2:-60}"
out="${GRPO_FUZZ_OUT:-$(mktemp -d /tmp/grpod-fuzz.XXXXXX)}"
mkdir -p "$out/corpus" "$out/gen"
CC="${CC_FUZZ:-clang}"
command -v "$CC" >/dev/null || { echo "skip: $CC not found"; exit 77; }
command -v protoc-c >/dev/null || { echo "skip: protoc-c not found"; exit 77; }
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' \
    >"$out/probe.c"
if ! "$CC" -fsanitize=fuzzer "$out/probe.c" -o "$out/probe" 2>/dev/null; then
    echo "skip: $CC has no libFuzzer (-fsanitize=fuzzer)"
    exit 77
fi

protoc-c --proto_path="$src/proto" --c_out="$out/gen" "$src/proto/grpo.proto"
mkdir -p "$out/gen/daemon"
printf '#define GRPO_VERSION_STRING "fuzz"\n' >"$out/gen/daemon/grpod_version.h"
# shellcheck disable=SC2046
"$CC" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -D_GNU_SOURCE -std=c17 \
    -I"$src" -I"$out/gen" \
    "$src/tests/fuzz/fuzz_grpod.c" \
    "$src"/daemon/{core,core_report,core_persist,validate,arena}.c "$src"/proto/{names,status_json}.c \
    "$src/proto/protocol.c" "$out/gen/grpo.pb-c.c" \
    "$src"/common/{log,check,clock,placement}.c "$src/proto/transport.c" \
    $(pkg-config --cflags --libs libprotobuf-c jansson nanomsg) -lm \
    -o "$out/fuzz_grpod"
echo "fuzzing grpod's parsers for $secs s (work directory $out)"
GRPO_FUZZ_SEEDS="$out/corpus" "$out/fuzz_grpod" "$out/corpus" -max_total_time="$secs" -max_len=4096 \
    -artifact_prefix="$out/" -print_final_stats=1 -rss_limit_mb=2048 2>"$out/fuzz.log" || {
    tail -n 60 "$out/fuzz.log"
    echo "FAIL: the fuzzer found a crash; input kept in $out/crash-*"
    exit 1
}
grep -E '^(stat::number_of_executed_units|stat::new_units_added|Done)' "$out/fuzz.log" || true
tail -n 2 "$out/fuzz.log"
[ -z "${GRPO_FUZZ_OUT:-}" ] && rm -rf "$out"
echo "ok: no crash"
