#!/usr/bin/env bash
# Build and run the test suites (unit, mpi, system, gpu, cluster; not slow).
#   ./scripts/test.sh                 everything but the slow suite
#   ./scripts/test.sh --suite unit    meson test arguments pass through (--help: this text)
#   ./scripts/test.sh --loaded        the same beside a CPU-heavy job (one busy process per core, for the whole
#                                     run): the suite must pass on a loaded machine too
# Installs missing Debian packages (as root) and fetches the bundled model.
# Every time bound of the tests (meson's per-test timeouts, the shell tests' wait_for and timeout) is scaled by
# how much slower than a quiet machine this one runs when the suite starts (scripts/time_scale.py; set
# GRPO_TEST_TIME_SCALE to choose the factor).
set -euo pipefail
cd "$(dirname "$0")/.."
LOADED=0
args=()
for a in "$@"; do
    case "$a" in
    --loaded) LOADED=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$a") ;;
    esac
done
set -- "${args[@]}"
./scripts/deps.sh
./scripts/build.sh build
# the bundled model: tests that read it skip without it, so fetch it first
if ! GRPO_MODEL_GGUF="$(./scripts/fetch_model.sh)"; then
    echo "warning: could not fetch the bundled model; tests that need it will be skipped" >&2
else
    export GRPO_MODEL_GGUF
fi
# pyarrow, for verl's parquet datasets (tests/system/test_parquet.sh skips without it)
./scripts/parquet_env.sh >/dev/null || echo "warning: could not install pyarrow; the parquet test will be skipped" >&2
# TensorBoard, whose own reader checks the event files (tests/system/test_tensorboard.sh skips without it)
./scripts/tensorboard_env.sh >/dev/null ||
    echo "warning: could not install tensorboard; the tensorboard-reader test will be skipped" >&2
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
if [ "$LOADED" = 1 ]; then
    hogs=()
    for _ in $(seq "$(nproc)"); do
        sha256sum /dev/zero >/dev/null 2>&1 &
        hogs+=($!)
    done
    trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
    echo "== --loaded: ${#hogs[@]} busy process(es) beside the tests (pids ${hogs[*]})"
fi
GRPO_TEST_TIME_SCALE="${GRPO_TEST_TIME_SCALE:-$(python3 scripts/time_scale.py -v)}"
export GRPO_TEST_TIME_SCALE
mult="$(awk -v f="$GRPO_TEST_TIME_SCALE" 'BEGIN { m = int(f); if (m < f) m++; print m < 1 ? 1 : m }')"
echo "== time bounds x $GRPO_TEST_TIME_SCALE (meson's timeouts x $mult)"
rc=0
meson test -C build --print-errorlogs --num-processes 2 --timeout-multiplier "$mult" "$@" || rc=$?
logs=(build/meson-logs/testlog.json)
# The CUDA back-end through tests/cuemu (CUDA emulated on the CPU, tests/cuemu/README.md): the gpu suite, which
# skips above without a GPU, runs here on any machine; then gpu-kernels with each block's threads in reverse order
# (a race shows as a difference), and the NCCL paths with a device per rank (gpu-per-rank, and EP, SP and CP in the
# model again). On a full run only (no arguments).
if [ $# -eq 0 ]; then
    rm -f build-emu/meson-logs/testlog-emu*.json
    ./scripts/build.sh build-emu -Dcuemu=true -Dcuda=disabled -Dtests=enabled || rc=1
    meson test -C build-emu --suite cuemu --suite gpu --no-suite gpu-per-rank --no-rebuild --print-errorlogs \
        --num-processes 2 --timeout-multiplier "$mult" --logbase testlog-emu || rc=1
    CUEMU_ORDER=reverse meson test -C build-emu gpu-kernels --no-rebuild --print-errorlogs \
        --timeout-multiplier "$mult" --logbase testlog-emu-reverse || rc=1
    CUEMU_DEVICES=2 meson test -C build-emu gpu-nccl-np2 gpu-nccl-deadline gpu-ep2-np2 gpu-sp2-np2 gpu-cp2-np2 \
        gpu-par-runs --no-rebuild --print-errorlogs --num-processes 2 --timeout-multiplier "$mult" \
        --logbase testlog-emu-nccl || rc=1
    logs+=(build-emu/meson-logs/testlog-emu*.json)
fi
python3 scripts/count_tests.py "${logs[@]}" || rc=1
exit $rc
