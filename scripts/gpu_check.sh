#!/usr/bin/env bash
# One command for a GPU session (sized for at most 8 minutes on one H200): build the CUDA back-end, run the GPU
# tests (full shapes, then small shapes under compute-sanitizer memcheck and racecheck), then benchmark it and
# print one table. The gpu suite includes the checks of the paths written but not yet run on a device: MoE routing
# and experts (gpu-kernels' moe lines, fp32 and BF16, against the CPU and a direct per-token reference, and expert
# parallelism's row moves), ring attention's blocks (ring block lines) and its device path over 2 ranks sharing the
# GPU (gpu-ring-np2), Ulysses' head-slice attention, NCCL's all-to-all and send-receive on device memory
# (gpu-nccl-np2, 2 GPUs), expert parallelism's dispatch and combine, Ulysses' all-to-all and ring attention in the
# model against one process on the device (gpu-ep2-np2, gpu-sp2-np2, gpu-cp2-np2: over MPI through host memory, and
# over NCCL with 2 GPUs), and whole GRPO runs with EP 2, SP 2 and CP 2 on the device (gpu-par-runs).
#
#   scripts/gpu_check.sh            everything
#   GPU_CHECK_SKIP_SANITIZER=1      skip the compute-sanitizer runs
#   GPU_CHECK_BENCH_SMALL=1         small benchmark shapes (a smoke run)
#   GPU_CHECK_EMULATE=1             a rehearsal without a GPU: the same steps on tests/cuemu (CUDA emulated on the
#                                   CPU; build-gpu-emu, no compute-sanitizer, small benchmark shapes whose times
#                                   mean nothing), so that a device session does not spend its minutes on this script
#
# Peaks the table compares against (H200 SXM): BF16 dense tensor-core 989 TFLOP/s (MFU column of the TFLOP/s
# rows, fp32 rows included, so they read as a fraction of what the chip's BF16 tensor cores could do), HBM3e
# 4.8 TB/s (decode rows), NVLink 450 GB/s per direction (NCCL row, busbw as nccl-tests defines it).
# Exit status: 0 when every test passed, 1 otherwise (the table is printed either way).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-8}"
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }
rc=0
bdir=build-gpu
log="$(mktemp -d /tmp/gpu_check.XXXXXX)"
emulate="${GPU_CHECK_EMULATE:-0}"
setup_args=(-Dcuda=enabled)

if [ "$emulate" = 1 ]; then
    bdir=build-gpu-emu
    setup_args=(-Dcuemu=true -Dcuda=disabled)
    ngpu="${CUEMU_DEVICES:-1}"
    export GPU_CHECK_SKIP_SANITIZER=1 GPU_CHECK_BENCH_SMALL=1
    stamp "REHEARSAL on tests/cuemu (CUDA emulated on the CPU): $ngpu emulated device(s); no time here means anything"
else
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    stamp "GPUs: $ngpu"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/   /'
fi
if [ "$ngpu" -eq 0 ]; then
    echo "no GPU visible: nothing to check here"
    exit 77
fi

# ---- build: a fresh directory; meson.build compiles sm_80 and sm_90 SASS plus compute_90 PTX ----
stamp "configure $bdir (${setup_args[*]})"
if [ -d "$bdir" ]; then
    meson setup --wipe "$bdir" "${setup_args[@]}" >"$log/setup.txt" 2>&1
else
    meson setup "$bdir" "${setup_args[@]}" >"$log/setup.txt" 2>&1
fi || { cat "$log/setup.txt"; echo "meson setup failed"; exit 1; }
stamp "build (ninja: the GPU tests, the bench, the worker)"
targets=(tests/gpu/test_gpu_kernels tests/gpu/test_gpu_model tests/gpu/test_gpu_parallel tests/gpu/gpu_bench
    worker/grpo-worker worker/grpo-model
    tests/mpi/compare_weights worker/rewards/reward_test_scorer.so) # gpu-run's whole runs need the last four
ninja -C "$bdir" "${targets[@]}" >"$log/build.txt" 2>&1 ||
    { tail -60 "$log/build.txt"; echo "build failed"; exit 1; }
grep -E "warning" "$log/build.txt" | head -20

# ---- tests ----
stamp "meson test --suite gpu (full shapes)"
# gpu-model also checks 32 greedy tokens of the bundled model against the CPU when it is cached
bundled="${GRPO_CACHE:-$HOME/.cache/grpo}/SmolLM2-135M-Instruct.Q4_1.gguf"
# (not in the rehearsal: the emulator takes minutes over the 135M model; its own run of gpu-model with the bundled
# model passes, tests/cuemu/README.md)
[ -f "$bundled" ] && [ "$emulate" != 1 ] && export GRPO_BUNDLED_MODEL="$bundled"
meson test -C "$bdir" --suite gpu --no-rebuild --print-errorlogs >"$log/test.txt" 2>&1 || rc=1
grep -E "^ *[0-9]+/[0-9]+ |^Ok:|^Fail:|^Skipped:|FAIL|failed" "$log/test.txt" | head -60
sed -n '/kops_cuda against/,/kops: /p' "$bdir/meson-logs/testlog.txt" | head -200
# the paths that have not run on a device before (MoE routing and experts, ring attention's blocks and its device
# path, Ulysses' head slices and all-to-all, expert parallelism's dispatch and combine, the parallel runs): their
# lines, so a failure among them is seen first
stamp "MoE / EP / ring attention / Ulysses lines (first device check of these paths)"
grep -E "^ *(moe |ring block|ring attention|  rank [0-9]+: ring attention)|attention B=[0-9]+ N=204[89] |nccl all-to-all|EP rows|per-token reference|FAIL" \
    "$bdir/meson-logs/testlog.txt" | head -80
grep -E "(EP|SP|CP) 2 on cuda, the group over|differs from the one-process run|(ok|FAIL) +(EP|SP|CP) 2|on CUDA over 2 ranks" \
    "$bdir/meson-logs/testlog.txt" | head -60

sanitizer="$(command -v compute-sanitizer || true)"
if [ -z "$sanitizer" ] && command -v nvcc >/dev/null; then
    for c in "$(dirname "$(command -v nvcc)")/compute-sanitizer" \
        "$(dirname "$(command -v nvcc)")/../extras/compute-sanitizer/compute-sanitizer"; do
        [ -x "$c" ] && sanitizer="$c" && break
    done
fi
if [ "${GPU_CHECK_SKIP_SANITIZER:-0}" = 0 ] && [ -n "$sanitizer" ]; then
    # memcheck on the kernel test with small shapes (GRPO_GPU_TEST_SMALL); the NCCL tests stay out of the
    # sanitizer (mpirun plus NCCL's own device memory make it slow and noisy, and the deadline test is timed)
    stamp "compute-sanitizer memcheck: meson test gpu-kernels, small shapes"
    GRPO_GPU_TEST_SMALL=1 meson test -C "$bdir" gpu-kernels --no-rebuild --print-errorlogs --timeout-multiplier 2 \
        --wrapper "$sanitizer --tool memcheck --error-exitcode 86 --print-limit 20" >"$log/memcheck.txt" 2>&1 ||
        { rc=1; echo "memcheck: FAILED"; grep -E "=========|FAIL" "$bdir/meson-logs/testlog.txt" | head -40; }
    grep -E "ERROR SUMMARY|^Ok:|^Fail:" "$bdir/meson-logs/testlog.txt" "$log/memcheck.txt" | head -5
    # racecheck: shared-memory hazards of the tiled kernels (attention, reductions); bounded in time
    stamp "compute-sanitizer racecheck: the kops tests, small shapes (at most 120 s)"
    GRPO_GPU_TEST_SMALL=1 timeout 120 "$sanitizer" --tool racecheck --error-exitcode 86 --print-limit 20 \
        "$bdir/tests/gpu/test_gpu_kernels" --kops >"$log/racecheck.txt" 2>&1
    r=$?
    if [ $r -eq 124 ]; then
        echo "racecheck: did not finish in 120 s (not counted as a failure)"
    elif [ $r -eq 77 ]; then
        echo "racecheck: skipped (no device)"
    elif [ $r -ne 0 ]; then
        rc=1
        echo "racecheck: FAILED (exit $r)"
        grep -E "=========|FAIL" "$log/racecheck.txt" | head -40
    fi
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$log/racecheck.txt" | head -3
else
    echo "compute-sanitizer: skipped (GPU_CHECK_SKIP_SANITIZER=1, or not found)"
fi

# ---- benchmarks: one table ----
stamp "benchmarks"
bench_args=()
[ "${GPU_CHECK_BENCH_SMALL:-0}" = 1 ] && bench_args+=(--small)
timeout 240 "$bdir/tests/gpu/gpu_bench" "${bench_args[@]}" >"$log/bench.txt" 2>&1
r=$?
if [ $r -ne 0 ]; then
    echo "gpu_bench: exit $r$([ $r -eq 124 ] && echo ' (timed out after 240 s)')"
    tail -20 "$log/bench.txt"
    [ $r -ne 77 ] && rc=1
fi
if [ "$ngpu" -ge 2 ]; then
    timeout 120 mpirun --oversubscribe -np 2 "$bdir/tests/gpu/gpu_bench" --nccl "${bench_args[@]}" \
        >>"$log/bench.txt" 2>&1 || { echo "NCCL bench failed:"; tail -20 "$log/bench.txt"; }
else
    echo "ROW|NCCL all-reduce bus bandwidth|np=2|-|skipped: 1 GPU|-" >>"$log/bench.txt"
fi

# one GRPO step's phase times on the bundled model (trainer.device=cuda, one process)
step_line="GRPO step on GPU: the worker was not built"
worker="$bdir/worker/grpo-worker"
if [ -x "$worker" ]; then
    gguf="${GRPO_CACHE:-$HOME/.cache/grpo}/SmolLM2-135M-Instruct.Q4_1.gguf"
    if [ "$emulate" = 1 ]; then # the rehearsal: a tiny random model (the 135M one takes the emulator too long)
        tok=tests/fixtures/tokenizers/bytes-chatml
        "$bdir/worker/grpo-model" init "$tok/config.json" "$log/tiny" --tokenizer-from "$tok" --seed 11 --std 0.1 \
            >"$log/tiny.txt" 2>&1 && gguf="$log/tiny"
    fi
    if [ -e "$gguf" ]; then
        stamp "one GRPO step on the GPU ($gguf)"
        out_dir="$log/grpo"
        small=() # the rehearsal: a step small enough for the emulator (the command and its parsing are the point)
        [ "$emulate" = 1 ] && small=(data.train_batch_size=2 actor_rollout_ref.rollout.n=2 data.max_response_length=8
            actor_rollout_ref.actor.ppo_mini_batch_size=2 trainer.val_before_train=false trainer.test_freq=-1)
        timeout "$([ "$emulate" = 1 ] && echo 900 || echo 180)" mpirun -np 1 "$worker" \
            actor_rollout_ref.model.path="$gguf" trainer.device=cuda trainer.total_training_steps=1 \
            trainer.default_local_dir="$out_dir" "${small[@]}" >"$log/grpo.txt" 2>&1
        step_line="GRPO step on GPU (exit $?): $(grep -oE '"?timing_s/[a-z_]+"?[:=] ?[0-9.]+' "$log/grpo.txt" \
            "$out_dir"/*/*/metrics.jsonl 2>/dev/null | sed 's/.*timing_s\///; s/"//g' | tr '\n' ' ')"
    else
        step_line="GRPO step on GPU: the bundled model is not cached ($gguf; scripts/fetch_model.sh needs the network)"
    fi
fi

echo
gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
[ "$emulate" = 1 ] && gpu_name="REHEARSAL on tests/cuemu, not a GPU"
echo "== GPU check: $gpu_name, $ngpu GPU(s)," \
    "$(( $(date +%s) - start )) s"
{
    echo "op|shape|ms/call|throughput|of peak"
    grep '^ROW|' "$log/bench.txt" | cut -d'|' -f2-
} | awk -F'|' '{ printf "%-36s %-34s %10s %16s %8s\n", $1, $2, $3, $4, $5 }'
echo "(peaks: BF16 dense 989 TFLOP/s for the TFLOP/s rows, HBM 4.8 TB/s for decode, NVLink 450 GB/s for NCCL)"
echo "$step_line"
echo "tests: $([ $rc -eq 0 ] && echo passed || echo FAILED) (logs: $log, $bdir/meson-logs/testlog.txt)"
exit $rc
