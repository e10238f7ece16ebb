#!/usr/bin/env bash
# Build libFuzzer harnesses with clang and run each for a bounded time (default 60 s each). Exit 77 (skipped)
# without clang's libFuzzer; 1 when a harness crashes, leaks or trips UBSan, naming the reproducer.
#
#   tests/fuzz/run_fuzz.sh [SOURCE_ROOT] [SECONDS] [TARGET...]
# Targets (default: grpod):
#   grpod      grpod's parsers: control requests, the journal, status replies (fuzz_grpod.c)
#   wire       the trainer's data socket: wire_unpack_batch (fuzz_wire.c)
#   dispatch   every dispatcher message, through the dispatcher's core (fuzz_dispatch.c)
#   checkpoint a checkpoint's state.json (fuzz_checkpoint.c)
# Each harness writes its seeds (real messages and files) at start. Crashes are kept in $GRPO_FUZZ_OUT (default:
# a temporary directory, printed; kept when something was found). Reproduce one with
#   $GRPO_FUZZ_OUT/fuzz_TARGET $GRPO_FUZZ_OUT/crash-...
set -euo pipefail
src="$(cd "${1:-$(dirname "$0")/../..}" && pwd)"
secs="${2:-60}"
shift $(($# > 2 ? 2 : $#))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(grpod)
keep="${GRPO_FUZZ_OUT:-}"
out="${GRPO_FUZZ_OUT:-$(mktemp -d /tmp/grpo-fuzz.XXXXXX)}"
mkdir -p "$out/gen"
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
mkdir -p "$out/gen/daemon" "$out/gen/common"
printf '#define GRPO_VERSION_STRING "fuzz"\n' >"$out/gen/daemon/grpod_version.h"
# the key table's names for messages, as the build generates them (common/meson.build)
python3 "$src/scripts/gen_key_names.py" "$src/common/config_keys.def" "$out/gen/common/config_key_names.h"
proto=("$src"/proto/{protocol,transport,plane_auth,ctl_auth}.c "$out/gen/grpo.pb-c.c")
base=("$src"/common/{log,check,clock,fs,backoff}.c)
sources() {
    case "$1" in
    grpod) echo "$src"/daemon/{core,core_report,core_persist,diagnose,validate,arena}.c "$src"/proto/{names,status_json,hang}.c \
        "${proto[@]}" "${base[@]}" "$src"/common/{placement,config_text,config,config_yaml,config_cli,config_verl,json_file,rollout_corr_spec}.c -lyaml -lm ;;
    wire) echo "$src"/worker/plane/{wire,dispatch_core,relay}.c "$src/worker/step/batch.c" "$src/worker/step/seq.c" \
        "${proto[@]}" "${base[@]}" ;;
    dispatch) echo "$src"/worker/plane/{dispatch_core,relay}.c "${proto[@]}" "${base[@]}" ;;
    checkpoint) echo "$src/worker/trainer/checkpoint_state.c" "${base[@]}" ;;
    *) return 1 ;;
    esac
}
# fuzz_one T: build T's harness and fuzz it for $secs s; its report in $out/report-T, its status in $out/rc-T
fuzz_one() {
    local t=$1 srcs
    {
        srcs=$(sources "$t")
        "$CC" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -D_GNU_SOURCE -std=c17 \
            -I"$src" -I"$out/gen" "$src/tests/fuzz/fuzz_$t.c" $srcs \
            $(pkg-config --cflags --libs libprotobuf-c jansson nanomsg libsodium) -lm -o "$out/fuzz_$t" || {
            echo "FAIL: fuzz target $t did not build"
            return 1
        }
        mkdir -p "$out/corpus-$t"
        echo "fuzzing $t for $secs s (work directory $out)"
        if ! GRPO_FUZZ_SEEDS="$out/corpus-$t" ASAN_OPTIONS=detect_leaks=1 "$out/fuzz_$t" "$out/corpus-$t" \
            -max_total_time="$secs" -max_len=8192 -artifact_prefix="$out/$t-" -print_final_stats=1 \
            -rss_limit_mb=2048 2>"$out/fuzz-$t.log"; then
            tail -n 60 "$out/fuzz-$t.log"
            echo "FAIL: fuzz target $t found a crash, leak or undefined behaviour; reproducer:" \
                "$out/fuzz_$t $(ls "$out/$t-"* 2>/dev/null | head -1)"
            return 1
        fi
        grep -E '^stat::(number_of_executed_units|new_units_added)' "$out/fuzz-$t.log" | tr '\n' ' ' || true
        echo
        echo "ok: $t, no crash"
    } >"$out/report-$t" 2>&1
}
for t in "${targets[@]}"; do # unknown names before any work
    sources "$t" >/dev/null || { echo "unknown fuzz target $t (grpod, wire, dispatch, checkpoint)"; exit 2; }
done
# one fuzzer per core at once (each is one process on one core): CI's four took 4 x 35 s one after the other
jobs="${GRPO_FUZZ_JOBS:-$(getconf _NPROCESSORS_ONLN)}" # the cores (nproc would count OMP_NUM_THREADS)
rc=0
pids=()
for t in "${targets[@]}"; do
    fuzz_one "$t" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$jobs" ]; then
        wait "${pids[0]}" || true
        pids=("${pids[@]:1}")
    fi
done
wait || true
for t in "${targets[@]}"; do
    cat "$out/report-$t"
    grep -q "^ok: $t, no crash" "$out/report-$t" || { rc=1; keep=1; }
done
[ -z "$keep" ] && rm -rf "$out"
exit $rc
