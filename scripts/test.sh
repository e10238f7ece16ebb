#!/usr/bin/env bash
# Build and run the test suites (unit, mpi, ft, system, gpu, cluster; not slow).
#   ./scripts/test.sh                 everything but the slow suite
#   ./scripts/test.sh --suite unit    meson test arguments pass through (--help: this text)
#   ./scripts/test.sh --loaded        the same beside a CPU-heavy job (one busy process per core, for the whole
#                                     run): the suite must pass on a loaded machine too
#   ./scripts/test.sh --sanitize      every test once, as CI runs them: the unit, system and mpi suites (but
#                                     `long`) in a build with AddressSanitizer and UBSan (build-asan), the rest in
#                                     the plain build (no meson arguments with it)
# Installs missing Debian packages (as root) and fetches the bundled model.
# Every time bound of the tests (meson's per-test timeouts, the shell tests' wait_for and timeout) is scaled by
# how much slower than a quiet machine this one runs when the suite starts (scripts/time_scale.py; set
# GRPO_TEST_TIME_SCALE to choose the factor).
set -euo pipefail
cd "$(dirname "$0")/.."
LOADED=0 SANITIZE=0
args=()
for a in "$@"; do
    case "$a" in
    --loaded) LOADED=1 ;;
    --sanitize) SANITIZE=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$a") ;;
    esac
done
set -- "${args[@]}"
if [ "$SANITIZE" = 1 ] && [ $# -gt 0 ]; then
    echo "test.sh: --sanitize runs every test and takes no meson arguments (given: $*)" >&2
    exit 2
fi
# each phase's wall time, said as it ends (where the run's time goes), with the CPU time of what it ran (the
# children this script and theirs have waited for: /proc's cutime + cstime): CPU / wall is the cores it kept busy
TP=$(date +%s)
cpu_s() { sed 's/.*) //' "/proc/$$/stat" | awk -v hz="$(getconf CLK_TCK)" '{ printf "%d", ($14 + $15) / hz }'; }
CP=$(cpu_s)
took() {
    local now cpu; now=$(date +%s) cpu=$(cpu_s)
    echo "== test.sh: $1 took $((now - TP)) s (CPU $((cpu - CP)) s)"
    TP=$now CP=$cpu
}
./scripts/deps.sh
took "dependencies"
./scripts/build.sh build
took "the build"
# A full run (no meson arguments) also tests the CUDA back-end under the emulator (below). Its build starts now,
# beside the tests, at a lower priority: the tests spend much of their time waiting (on MPI start-ups, grpod's
# heartbeats, the namespace hosts' links), and the build fills those gaps instead of running alone afterwards.
# Only the programs of the suites it runs (9 of the build's 93 targets, with the libraries they link).
emu_pid="" ft_pid="" ft_log=""
if [ $# -eq 0 ]; then
    emu_log="$(mktemp)"
    GRPO_BUILD_SUITES="cuemu gpu" GRPO_BUILD_NO_SUITES=gpu-per-rank GRPO_BUILD_JOBS=2 setsid nice -n 10 \
        ./scripts/build.sh build-emu -Dcuemu=true -Dcuda=disabled -Dtests=enabled >"$emu_log" 2>&1 &
    emu_pid=$! # setsid: its own process group, so that the compilers end with it
fi
hogs=()
# what this script started in the background ends with it
cleanup() {
    [ -z "$emu_pid" ] || kill -- "-$emu_pid" 2>/dev/null || true
    [ ${#hogs[@]} -eq 0 ] || kill "${hogs[@]}" 2>/dev/null || true
    [ -z "$ft_pid" ] || kill -- "-$ft_pid" 2>/dev/null || true
    rm -f "${emu_log:-}" "${ft_log:-}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
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
# Open MPI 5 with its fault-tolerant MPI (ULFM), for the ft suite (tests/ft; skipped without it). On a full run its
# build against Open MPI 5 (build-ft: the suite's programs only) starts now, beside the tests as the emulator's does,
# and its suite runs at the end; then the same against Open MPI 5 with CUDA emulated (build-ft-emu), for
# ft-survive-nccl alone (trainer-loss survival over NCCL; its own build: in build-ft, trainer.device=auto would take
# the emulated device, and scripts/mpirun_ft runs build-ft's worker).
if ompi5="$(./scripts/ompi5_env.sh)"; then
    if [ $# -eq 0 ]; then
        ft_log="$(mktemp)"
        # shellcheck disable=SC2016 # expanded by the inner shell
        GRPO_BUILD_SUITES=ft GRPO_BUILD_JOBS=1 setsid nice -n 10 bash -c '
            ./scripts/build.sh build-ft -Dmpi_prefix="$1" -Dulfm=enabled -Dcuda=disabled || exit
            echo "== build-ft built"
            ./scripts/build.sh build-ft-emu -Dmpi_prefix="$1" -Dulfm=enabled -Dcuemu=true -Dcuda=disabled' \
            _ "$ompi5" >"$ft_log" 2>&1 &
        ft_pid=$!
    fi
else
    echo "warning: could not install Open MPI 5 (scripts/ompi5_env.sh); the ft suite will be skipped" >&2
fi
took "the model and the Python environments"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
if [ "$LOADED" = 1 ]; then
    # every core (nproc alone counts OMP_NUM_THREADS, set to 1 just above: one hog on 2 cores was too few)
    for _ in $(seq "$(getconf _NPROCESSORS_ONLN)"); do
        sha256sum /dev/zero >/dev/null 2>&1 &
        hogs+=($!)
    done
    echo "== --loaded: ${#hogs[@]} busy process(es) beside the tests (pids ${hogs[*]})"
fi
GRPO_TEST_TIME_SCALE="${GRPO_TEST_TIME_SCALE:-$(python3 scripts/time_scale.py -v)}"
export GRPO_TEST_TIME_SCALE
mult="$(awk -v f="$GRPO_TEST_TIME_SCALE" 'BEGIN { m = int(f); if (m < f) m++; print m < 1 ? 1 : m }')"
echo "== time bounds x $GRPO_TEST_TIME_SCALE (meson's timeouts x $mult)"
rc=0
if [ "$SANITIZE" = 0 ]; then
    meson test -C build --print-errorlogs --num-processes 2 --timeout-multiplier "$mult" "$@" || rc=$?
    logs=(build/meson-logs/testlog.json)
    took "the tests"
else
    # Each test once. AddressSanitizer and UBSan on the CPU code (nvcc does not take -fsanitize): the unit suite with
    # LeakSanitizer; the system and mpi suites without it (every grpo-worker and MPI test program runs Open MPI,
    # which leaves its allocations to the exit, some from components it has already unloaded: frames no suppression
    # can name), their time bounds x3 for the sanitizers' slowdown. The `long` suite (the SP and CP runs with
    # 2,048-token responses, 5 and 4 minutes each under the sanitizers) and the cluster and gpu suites run in the
    # plain build; the long runs' code runs under the sanitizers in model-sp*, model-cp* and ring-attn-*.
    rm -f build/meson-logs/testlog.json build-asan/meson-logs/testlog*.json
    asan_mult="$(awk -v f="$GRPO_TEST_TIME_SCALE" 'BEGIN { m = 3 * f; r = int(m); print r < m ? r + 1 : r }')"
    san=(UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1)
    # only the programs of the suites it runs (scripts/suite_targets.py): not the benchmarks nor the gpu tests
    if GRPO_BUILD_SUITES="unit system mpi" GRPO_BUILD_NO_SUITES=long \
        ./scripts/build.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled; then
        took "the sanitizer build"
        env "${san[@]}" ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
            meson test -C build-asan --suite unit --no-rebuild --print-errorlogs --num-processes 2 \
            --timeout-multiplier "$asan_mult" || rc=1
        took "the unit suite under the sanitizers"
        env "${san[@]}" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
            meson test -C build-asan --suite system --suite mpi --no-suite long --no-rebuild \
            --timeout-multiplier "$asan_mult" \
            --logbase testlog-mpi-system --print-errorlogs --num-processes 2 || rc=1
        took "the system and mpi suites under the sanitizers"
    else
        echo "test.sh: the sanitizer build failed" >&2
        rc=1
    fi
    logs=(build-asan/meson-logs/testlog*.json)
    # the plain build: every test of the default setup outside unit, system and mpi, and the long ones
    mapfile -t plain < <(meson introspect --tests build | python3 -c '
import json, sys
for t in json.load(sys.stdin):
    s = {x.split(":")[-1] for x in t["suite"]}
    if "slow" not in s and (not s <= {"unit", "system", "mpi"} or "long" in s):
        print(t["name"])')
    meson test -C build --print-errorlogs --num-processes 2 --timeout-multiplier "$mult" "${plain[@]}" || rc=$?
    logs+=(build/meson-logs/testlog.json)
    took "the plain build's other suites (cluster, long, gpu)"
fi
# The CUDA back-end through tests/cuemu (CUDA emulated on the CPU, tests/cuemu/README.md): the gpu suite, which
# skips above without a GPU, runs here on any machine, in one meson run with every emulated configuration
# (tests/gpu/meson.build): the tests of 2 ranks with one shared device and again with a device per rank (-2dev:
# NCCL), gpu-kernels again with each block's threads in reverse order. On a full run only (no meson arguments).
if [ $# -eq 0 ]; then
    rm -f build-emu/meson-logs/testlog-emu*.json
    # its build, started after the plain one (above): what it printed, and whether it built
    erc=0
    wait "$emu_pid" || erc=$?
    cat "$emu_log"
    [ $erc -eq 0 ] || { echo "test.sh: the emulator's build failed (exit $erc)" >&2; rc=1; }
    took "the rest of the emulator's build (it ran beside the tests)"
    meson test -C build-emu --suite cuemu --suite gpu --no-suite gpu-per-rank --no-rebuild --print-errorlogs \
        --num-processes 2 --timeout-multiplier "$mult" --logbase testlog-emu || rc=1
    logs+=(build-emu/meson-logs/testlog-emu*.json)
    took "the gpu suite under the emulator"
fi
# The ft suite against Open MPI 5 with ULFM (tests/ft/meson.build: trainer ranks SIGKILLed at points of a step, the
# survivors go on), from its builds started above, and ft-survive-nccl (the same on emulated GPUs, over NCCL) from
# build-ft-emu. On a full run only.
if [ -n "$ft_pid" ]; then
    rm -f build-ft/meson-logs/testlog-ft*.json build-ft-emu/meson-logs/testlog-ft-nccl*.json
    frc=0
    wait "$ft_pid" || frc=$?
    cat "$ft_log"
    took "the rest of the builds against Open MPI 5 (they ran beside the tests)"
    if [ $frc -eq 0 ]; then
        meson test -C build-ft --suite ft --no-rebuild --print-errorlogs --num-processes 2 \
            --timeout-multiplier "$mult" --logbase testlog-ft || rc=1
        logs+=(build-ft/meson-logs/testlog-ft*.json)
        took "the ft suite (Open MPI 5, ULFM)"
        meson test -C build-ft-emu --no-rebuild --print-errorlogs --timeout-multiplier "$mult" \
            --logbase testlog-ft-nccl ft-survive-nccl || rc=1
        logs+=(build-ft-emu/meson-logs/testlog-ft-nccl*.json)
        took "ft-survive-nccl (Open MPI 5, ULFM, CUDA emulated)"
    else
        echo "test.sh: a build against Open MPI 5 failed (exit $frc)" >&2
        rc=1
    fi
fi
python3 scripts/count_tests.py "${logs[@]}" || rc=1
exit $rc
