#!/usr/bin/env bash
# Build and run the test suites (unit, mpi, ft, system, gpu, cluster; not slow).
#   ./scripts/test.sh                 everything but the slow suite
#   ./scripts/test.sh --suite unit    meson test arguments pass through (--help: this text)
#   ./scripts/test.sh --loaded        the same beside a CPU-heavy job (one busy process per core, for the whole
#                                     run): the suite must pass on a loaded machine too
#   ./scripts/test.sh --sanitize      every test once, as CI runs them: the unit, system and mpi suites (but
#                                     `long`) in a build with AddressSanitizer and UBSan (build-asan), the rest in
#                                     the plain build (no meson arguments with it)
# A full run (no meson arguments) runs its tests in two streams at once (below), each printed whole as it ends.
# Installs missing Debian packages (as root) and fetches the bundled model.
# Every time bound of the tests (meson's per-test timeouts, the shell tests' wait_for and timeout) is scaled by
# how much slower than a quiet machine this one runs when the suite starts (scripts/time_scale.py; set
# GRPO_TEST_TIME_SCALE to choose the factor).
set -euo pipefail
cd "$(dirname "$0")/.."
LOADED=0 SANITIZE=0
hogs=() streams=() emu_pid="" ft_pid="" asan_pid="" BG=""
# what this script started in the background ends with it
cleanup() {
    local p
    for p in "$emu_pid" "$ft_pid" "$asan_pid" "${streams[@]}"; do
        [ -z "$p" ] || kill -- "-$p" 2>/dev/null || true
    done
    [ ${#hogs[@]} -eq 0 ] || kill "${hogs[@]}" 2>/dev/null || true
    [ -z "$BG" ] || rm -rf "$BG"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
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
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
if [ "$LOADED" = 1 ]; then
    # every core (nproc alone counts OMP_NUM_THREADS, set to 1 just above: one hog on 2 cores was too few)
    for _ in $(seq "$(getconf _NPROCESSORS_ONLN)"); do
        sha256sum /dev/zero >/dev/null 2>&1 &
        hogs+=($!)
    done
    echo "== --loaded: ${#hogs[@]} busy process(es) beside the tests (pids ${hogs[*]})"
fi
# measured here, before this script starts its own builds beside the tests (below): the machine as the tests find it
GRPO_TEST_TIME_SCALE="${GRPO_TEST_TIME_SCALE:-$(python3 scripts/time_scale.py -v)}"
export GRPO_TEST_TIME_SCALE
# meson's --timeout-multiplier: the time scale rounded up to a whole number, at least 1
meson_mult() { awk -v f="$GRPO_TEST_TIME_SCALE" 'BEGIN { m = int(f); if (m < f) m++; print m < 1 ? 1 : m }'; }
mult="$(meson_mult)"
echo "== time bounds x $GRPO_TEST_TIME_SCALE (meson's timeouts x $mult)"
# A full run (no meson arguments) also tests the CUDA back-end under the emulator (below). Its build starts now,
# beside the tests, at a lower priority: the tests spend much of their time waiting (on MPI start-ups, grpod's
# heartbeats, the namespace hosts' links), and the build fills those gaps instead of running alone afterwards.
# Only the programs of the suites it runs (9 of the build's 93 targets, with the libraries they link).
# With --sanitize, the sanitizer build starts now too, at the normal priority (the first tests wait for it), beside
# the downloads below (the model, the Python environments, Open MPI 5: a network's time, not the cores').
# Each such job runs in a session of its own (setsid: its compilers end with it) and leaves its exit status in
# $BG/NAME.rc; its output goes to $BG/NAME.log, printed when a stream waits for it (bg_wait: the streams are not its
# parent, so they wait for its pid's end).
BG="$(mktemp -d)"
export BG
# bg_start NAME NICE CMD...: CMD in the background as above
bg_start() {
    local name="$1" n="$2"
    shift 2
    # shellcheck disable=SC2016 # expanded by the inner shell
    setsid nice -n "$n" bash -c '"${@:2}"; echo $? >"$1"' _ "$BG/$name.rc" "$@" >"$BG/$name.log" 2>&1 &
}
# bg_wait NAME PID: wait for job NAME (pid PID) to end, print its output; its exit status (1 when it left none)
bg_wait() {
    [ -n "$2" ] && tail --pid="$2" -f /dev/null
    cat "$BG/$1.log" 2>/dev/null
    return "$(cat "$BG/$1.rc" 2>/dev/null || echo 1)"
}
if [ $# -eq 0 ]; then
    GRPO_BUILD_SUITES="cuemu gpu" GRPO_BUILD_NO_SUITES=gpu-per-rank GRPO_BUILD_JOBS=2 \
        bg_start emu 10 ./scripts/build.sh build-emu -Dcuemu=true -Dcuda=disabled -Dtests=enabled
    emu_pid=$!
fi
if [ "$SANITIZE" = 1 ]; then
    # only the programs of the suites it runs (scripts/suite_targets.py): not the benchmarks nor the gpu tests
    GRPO_BUILD_SUITES="unit system mpi" GRPO_BUILD_NO_SUITES=long \
        bg_start asan 0 ./scripts/build.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled
    asan_pid=$!
fi
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
        # shellcheck disable=SC2016 # expanded by the inner shell
        GRPO_BUILD_SUITES=ft GRPO_BUILD_JOBS=1 bg_start ft 10 bash -c '
            ./scripts/build.sh build-ft -Dmpi_prefix="$1" -Dulfm=enabled -Dcuda=disabled || exit
            echo "== build-ft built"
            ./scripts/build.sh build-ft-emu -Dmpi_prefix="$1" -Dulfm=enabled -Dcuemu=true -Dcuda=disabled' \
            _ "$ompi5"
        ft_pid=$!
    fi
else
    echo "warning: could not install Open MPI 5 (scripts/ompi5_env.sh); the ft suite will be skipped" >&2
fi
took "the model and the Python environments"
rc=0
if [ $# -gt 0 ]; then
    # some tests (meson arguments): the plain build, as asked
    meson test -C build --print-errorlogs --num-processes 2 --timeout-multiplier "$mult" "$@" || rc=$?
    took "the tests"
    python3 scripts/count_tests.py build/meson-logs/testlog.json || rc=1
    exit $rc
fi

# A full run: every test once, in two streams at once. Each stream runs its tests one after another (most tests
# are not parallel: MPI ranks oversubscribe the cores), and each alone keeps about half of 2 cores busy (vmstat: 50%
# idle through the mpi suite alone; the cluster suite's hosts wait on links, grpod's heartbeats, sshd): together they
# fill the cores, where one after the other CI took 50 minutes on 2 quiet cores. Their time bounds are scaled by
# half as much again (STREAM_SCALE) for the other stream's share of the cores.
#  - core: the unit, system and mpi suites (not `long`); with --sanitize in build-asan (AddressSanitizer and UBSan
#    on the CPU code; nvcc does not take -fsanitize): the unit suite with LeakSanitizer, the system and mpi suites
#    without it (every grpo-worker and MPI test program runs Open MPI, which leaves its allocations to the exit,
#    some from components it has already unloaded: frames no suppression can name), their time bounds x3 for the
#    sanitizers' slowdown;
#  - rest: the plain build's other tests (cluster, long, gpu: the long suite's SP and CP runs with 2,048-token
#    responses took 5 and 4 minutes each under the sanitizers; their code runs there in model-sp*, model-cp* and
#    ring-attn-*), then the ft suite against Open MPI 5 with ULFM (tests/ft/meson.build: trainer ranks SIGKILLed at
#    points of a step, the survivors go on) and ft-survive-nccl (the same on emulated GPUs, over NCCL) from
#    build-ft-emu, then the CUDA back-end through tests/cuemu (CUDA emulated on the CPU, tests/cuemu/README.md): the
#    gpu suite, which skips in the plain build without a GPU, in one meson run with every emulated configuration
#    (tests/gpu/meson.build): the tests of 2 ranks with one shared device and again with a device per rank (-2dev:
#    NCCL), gpu-kernels again with each block's threads in reverse order.
# Each stream's output goes to its own file, printed whole when the stream ends.
STREAM_SCALE=1.5
GRPO_TEST_TIME_SCALE="$(awk -v f="$GRPO_TEST_TIME_SCALE" -v s="$STREAM_SCALE" 'BEGIN { print f * s }')"
mult="$(meson_mult)"
echo "== two streams: time bounds x $GRPO_TEST_TIME_SCALE (x $STREAM_SCALE for the other stream; meson's x $mult)"
mapfile -t old_logs < <(scripts/test_logs.sh)
rm -f "${old_logs[@]}"

stream_core() {
    local rc=0 asan_mult brc=0
    if [ "$SANITIZE" = 0 ]; then
        meson test -C build --suite unit --suite system --suite mpi --no-suite long --no-rebuild --print-errorlogs \
            --num-processes 2 --timeout-multiplier "$mult" --logbase testlog-core || rc=1
        took "core: the unit, system and mpi suites"
        return $rc
    fi
    bg_wait asan "$asan_pid" || brc=$?
    took "core: the rest of the sanitizer build (it ran beside the downloads)"
    if [ $brc -ne 0 ]; then
        echo "test.sh: the sanitizer build failed (exit $brc)" >&2
        return 1
    fi
    asan_mult="$(awk -v f="$GRPO_TEST_TIME_SCALE" 'BEGIN { m = 3 * f; r = int(m); print r < m ? r + 1 : r }')"
    local san=(UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1)
    env "${san[@]}" ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
        LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0" \
        meson test -C build-asan --suite unit --no-rebuild --print-errorlogs --num-processes 2 \
        --timeout-multiplier "$asan_mult" || rc=1
    took "core: the unit suite under the sanitizers"
    env "${san[@]}" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
        meson test -C build-asan --suite system --suite mpi --no-suite long --no-rebuild \
        --timeout-multiplier "$asan_mult" \
        --logbase testlog-mpi-system --print-errorlogs --num-processes 2 || rc=1
    took "core: the system and mpi suites under the sanitizers"
    return $rc
}

stream_rest() {
    local rc=0 erc=0 frc=0 plain
    # the plain build: every test of the default setup outside unit, system and mpi, and the long ones
    mapfile -t plain < <(meson introspect --tests build | python3 -c '
import json, sys
for t in json.load(sys.stdin):
    s = {x.split(":")[-1] for x in t["suite"]}
    if "slow" not in s and (not s <= {"unit", "system", "mpi"} or "long" in s):
        print(t["name"])')
    meson test -C build --no-rebuild --print-errorlogs --num-processes 2 --timeout-multiplier "$mult" \
        --logbase testlog-rest "${plain[@]}" || rc=1
    took "rest: the plain build's other suites (cluster, long, gpu)"
    if [ -n "$ft_pid" ]; then
        bg_wait ft "$ft_pid" || frc=$?
        took "rest: the rest of the builds against Open MPI 5 (they ran beside the tests)"
        if [ $frc -eq 0 ]; then
            meson test -C build-ft --suite ft --no-suite slow --no-rebuild --print-errorlogs --num-processes 2 \
                --timeout-multiplier "$mult" --logbase testlog-ft || rc=1
            took "rest: the ft suite (Open MPI 5, ULFM)"
            meson test -C build-ft-emu --no-rebuild --print-errorlogs --timeout-multiplier "$mult" \
                --logbase testlog-ft-nccl ft-survive-nccl || rc=1
            took "rest: ft-survive-nccl (Open MPI 5, ULFM, CUDA emulated)"
        else
            echo "test.sh: a build against Open MPI 5 failed (exit $frc)" >&2
            rc=1
        fi
    fi
    bg_wait emu "$emu_pid" || erc=$?
    took "rest: the rest of the emulator's build (it ran beside the tests)"
    if [ $erc -ne 0 ]; then
        echo "test.sh: the emulator's build failed (exit $erc)" >&2
        return 1
    fi
    meson test -C build-emu --suite cuemu --suite gpu --no-suite gpu-per-rank --no-rebuild --print-errorlogs \
        --num-processes 2 --timeout-multiplier "$mult" --logbase testlog-emu || rc=1
    took "rest: the gpu suite under the emulator"
    return $rc
}

T_STREAMS=$(date +%s)
declare -A stream_log=() stream_name=()
for s in core rest; do
    f="$(mktemp)"
    # setsid: each stream its own process group (the cleanup ends what is left of it)
    setsid bash -c "$(declare -p SANITIZE mult asan_pid ft_pid emu_pid); $(declare -f took cpu_s bg_wait stream_$s)
        TP=\$(date +%s) CP=\$(cpu_s); stream_$s" >"$f" 2>&1 &
    streams+=($!)
    stream_log[$!]="$f" stream_name[$!]="$s"
done
pending=("${streams[@]}")
for _ in core rest; do
    done_pid="" src=0
    wait -n -p done_pid "${pending[@]}" || src=$?
    echo "== stream ${stream_name[$done_pid]} ended after $(($(date +%s) - T_STREAMS)) s (exit $src); what it printed:"
    cat "${stream_log[$done_pid]}"
    rm -f "${stream_log[$done_pid]}"
    [ $src -eq 0 ] || rc=1
    left=() # the one waited for is no job any more (wait would say "no such job")
    for p in "${pending[@]}"; do [ "$p" = "$done_pid" ] || left+=("$p"); done
    pending=("${left[@]}")
done
streams=()
took "both streams"
mapfile -t logs < <(scripts/test_logs.sh)
python3 scripts/count_tests.py "${logs[@]}" || rc=1
exit $rc
