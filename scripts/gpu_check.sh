#!/usr/bin/env bash
# The device session's one command: everything the project can learn on a GPU machine within one deadline (480 s by
# default), the most informative steps first, each capped by the time left, every log streamed into OUT and
# OUT/summary.txt written on exit whatever happens. It runs from the device kit (scripts/gpu_kit.sh: the programs
# and the Debian libraries they load, built here; the machine needs only its CUDA runtime, cuBLAS and NCCL), or,
# with no kit, from a build it makes (a machine with the Debian development packages).
#
#   scripts/gpu_check.sh [OUT]        OUT: the folder for the logs and summary.txt (default $OUT, else gpu-check-out)
#   GPU_CHECK_DEADLINE_S=480          the whole run's deadline, in seconds
#   GPU_CHECK_KIT=kit                 the kit to run from (default kit/, kit-emu/ for a rehearsal)
#   GPU_CHECK_EMULATE=1               a rehearsal without a GPU: the same steps from the emulated kit (gpu_kit.sh
#                                     --emulate: CUDA emulated on the CPU by tests/cuemu); no time it prints means
#                                     anything, and what needs a GPU (nvidia-smi, compute-sanitizer, clocks) says so
#
# The steps, by information per second:
#   probe      nvidia-smi, nvcc, the kit's libraries and the CUDA ones it found, compute-sanitizer
#   kernels    every CUDA op against the CPU back-end (test_gpu_kernels: full shapes; MoE, ring attention, Ulysses,
#              BF16 attention on tensor cores against a float64 reference)
#   bench      the heavy ops' throughput (gpu_bench), SM and memory clocks sampled every 0.5 s beside it
#   memcheck   compute-sanitizer memcheck, then racecheck, on the kernel test's small shapes
#   step-fp32, step-bf16   one GRPO step of a small random model on the GPU (trainer.device=cuda): phase times and
#              generation tokens/s from its metrics
#   nccl       a 1-rank NCCL communicator's all-reduce, all-to-all and send-receive against MPI; then 2 ranks on the
#              one GPU, which NCCL refuses (said, not failed)
#   then the whole-run suites with the time left: gpu-model, gpu-run, gpu-dist, gpu-ring-np2, gpu-ep2/sp2/cp2-np2,
#   gpu-par-runs
# Peaks the bench table compares against (H200 SXM): BF16 dense tensor-core 989 TFLOP/s, HBM3e 4.8 TB/s, NVLink
# 450 GB/s per direction. Exit status: 0 when every step that ran passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SRC="$PWD"
OUTD="${1:-${OUT:-gpu-check-out}}"
mkdir -p "$OUTD" && OUTD="$(cd "$OUTD" && pwd)"
DEADLINE_S="${GPU_CHECK_DEADLINE_S:-480}"
emulate="${GPU_CHECK_EMULATE:-0}"
start=$(date +%s)
deadline=$((start + DEADLINE_S))
rc=0
steps=() # "NAME|status|seconds|note" for the summary
notes=()
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export GRPO_COMM_SYNC_SENDS=1 OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-8}"

left() { echo $((deadline - $(date +%s))); }
say() { echo "== [$(($(date +%s) - start)) s, $(left) s left] $*"; }
summary() {
    {
        echo "gpu_check: $([ "$emulate" = 1 ] && echo "REHEARSAL on tests/cuemu, not a GPU" || echo "${gpu_name:-no GPU named by nvidia-smi}")," \
            "$(($(date +%s) - start)) s of a $DEADLINE_S s deadline; exit $rc"
        echo "kit: ${GRPO_KIT_SAYS:-no kit (a local build)}"
        echo
        printf '%-14s %-8s %6s  %s\n' step status secs note
        local s
        for s in "${steps[@]}"; do
            IFS='|' read -r n st t note <<<"$s"
            printf '%-14s %-8s %6s  %s\n' "$n" "$st" "$t" "$note"
        done
        echo
        [ -f "$OUTD/bench.log" ] && {
            echo "op|shape|ms/call|throughput|of peak"
            grep '^ROW|' "$OUTD/bench.log" | cut -d'|' -f2-
        } | awk -F'|' '{ printf "%-36s %-34s %10s %16s %8s\n", $1, $2, $3, $4, $5 }'
        [ -f "$OUTD/clocks.csv" ] && echo "clocks (SM, memory MHz; min/max over the bench): $(awk -F', *' 'NR > 1 && $1 + 0 > 0 { if (!n++ || $1 < a) a = $1; if ($1 > b) b = $1; if (!m++ || $2 < c) c = $2; if ($2 > d) d = $2 } END { if (n) printf "SM %d-%d, memory %d-%d", a, b, c, d; else printf "not read" }' "$OUTD/clocks.csv")"
        local x
        for x in "${notes[@]}"; do echo "$x"; done
    } >"$OUTD/summary.txt"
    cat "$OUTD/summary.txt"
}
trap 'summary' EXIT
trap 'echo "gpu_check: interrupted"; rc=1; exit 1' INT TERM

# step NAME CAP CMD...: CMD with at most min(CAP, the time left) seconds, its output in OUT/NAME.log; 77 = skipped
step() {
    local name="$1" cap="$2"
    shift 2
    local t
    t=$(left)
    [ "$cap" -lt "$t" ] && t=$cap
    if [ "$t" -lt 10 ]; then
        steps+=("$name|no time|0|the deadline came first")
        say "$name: no time left"
        return 0
    fi
    say "$name (at most $t s)"
    local t0 r
    t0=$(date +%s)
    # (through bash: a step may be one of the functions below, exported)
    timeout --kill-after=5 "$t" bash -c '"$@"' "$name" "$@" >"$OUTD/$name.log" 2>&1
    r=$?
    local st=ok note=""
    case $r in
    0) ;;
    77) st=skipped note="$(tail -n 1 "$OUTD/$name.log")" ;;
    124 | 137)
        if [ "$t" -lt "$cap" ]; then # the deadline, not the step's own bound: not a failure
            st=cut note="the deadline came after $t s"
        else
            st=timeout note="over its $cap s" && rc=1
        fi
        ;;
    *) st=FAILED note="exit $r: $(grep -m1 -E 'FAIL|error|Error' "$OUTD/$name.log" | cut -c1-120)" && rc=1 ;;
    esac
    [ -n "${STEP_NOTE:-}" ] && note="$STEP_NOTE${note:+; $note}"
    steps+=("$name|$st|$(($(date +%s) - t0))|$note")
    STEP_NOTE=""
    echo "   $st ($(($(date +%s) - t0)) s)"
    return $r
}

# ---- the programs: the kit, else a build here ----
kit="${GPU_CHECK_KIT:-$([ "$emulate" = 1 ] && echo kit-emu || echo kit)}"
if [ -f "$kit/env.sh" ]; then
    # shellcheck disable=SC1091
    . "$kit/env.sh"
    B="$GRPO_KIT/build"
else
    B="$SRC/$([ "$emulate" = 1 ] && echo build-gpu-emu || echo build-gpu)"
    setup=(-Dcuda=enabled -Dgpu_archs=90)
    [ "$emulate" = 1 ] && setup=(-Dcuemu=true -Dcuda=disabled)
    say "no kit at $kit: building $B (${setup[*]})"
    { [ -f "$B/build.ninja" ] || meson setup "$B" -Dtests=enabled "${setup[@]}"; } >"$OUTD/build.log" 2>&1 &&
        ninja -C "$B" tests/gpu/test_gpu_kernels tests/gpu/test_gpu_model tests/gpu/test_gpu_parallel \
            tests/gpu/gpu_bench worker/grpo-worker worker/grpo-model tests/mpi/compare_weights \
            worker/rewards/reward_test_scorer.so >>"$OUTD/build.log" 2>&1 ||
        { echo "build failed: $OUTD/build.log (build the kit with scripts/gpu_kit.sh instead)"; rc=1; exit 1; }
fi
export OUTD emulate
# the test scripts below take the programs of $B by name (tests/lib.sh's prog)
export GRPO_BUILD_ROOT="$B"
K="$B/tests/gpu/test_gpu_kernels"
W="$B/worker/grpo-worker"
M="$B/worker/grpo-model"

# ---- probe ----
probe() {
    echo "date: $(date -u +%FT%TZ); host $(hostname); $(nproc) CPUs"
    if [ "$emulate" = 1 ]; then
        echo "nvidia-smi: none (rehearsal)"
    else
        nvidia-smi || true
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit \
            --format=csv || true
    fi
    command -v nvcc && nvcc --version | tail -n 2
    echo "kit: ${GRPO_KIT_SAYS:-none}"
    echo "compute-sanitizer: ${sanitizer:-not found}"
    echo "ldd $W:"
    ldd "$W" | grep -E "not found|cuda|cublas|nccl|nvrtc" || true
    "$K" --probe 1
}
export -f probe
sanitizer="$(command -v compute-sanitizer || true)"
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/extras/compute-sanitizer/compute-sanitizer; do
    [ -z "$sanitizer" ] && [ -x "$c" ] && sanitizer="$c"
done
gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
export K W M SO CMP sanitizer
step probe 30 probe
grep -q "=> not found" "$OUTD/probe.log" && notes+=("probe: a library was not found: $(grep -m3 '=> not found' "$OUTD/probe.log" | tr '\n' ' ')")
if ! "$K" --probe 1 >/dev/null 2>&1; then
    echo "no CUDA device visible (see $OUTD/probe.log): nothing more to check"
    rc=1
    exit 1
fi

# ---- the kernels against the CPU ----
bundled="${GRPO_CACHE:-$HOME/.cache/grpo}/SmolLM2-135M-Instruct.Q4_1.gguf"
step kernels 150 "$K"
notes+=("kernels: $(grep -cE '^ *ok|: ok|equal|agree' "$OUTD/kernels.log") lines ok, $(grep -cE 'FAIL|MISMATCH' "$OUTD/kernels.log") failing")

# ---- bench, clocks sampled beside it ----
clock_pid=""
if [ "$emulate" != 1 ]; then
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader,nounits -lms 500 \
        >"$OUTD/clocks.csv" 2>/dev/null &
    clock_pid=$!
fi
bench_args=()
[ "$emulate" = 1 ] && bench_args+=(--small)
step bench 120 "$B/tests/gpu/gpu_bench" "${bench_args[@]}"
[ -n "$clock_pid" ] && kill "$clock_pid" 2>/dev/null

# ---- compute-sanitizer on small shapes ----
if [ -n "$sanitizer" ] && [ "$emulate" != 1 ]; then
    GRPO_GPU_TEST_SMALL=1 step memcheck 90 "$sanitizer" --tool memcheck --error-exitcode 86 --print-limit 20 "$K" --kops
    GRPO_GPU_TEST_SMALL=1 step racecheck 90 "$sanitizer" --tool racecheck --error-exitcode 86 --print-limit 20 "$K" --kops
else
    steps+=("memcheck|skipped|0|$([ "$emulate" = 1 ] && echo "rehearsal: no compute-sanitizer on the emulator" || echo "compute-sanitizer not found")")
fi

# ---- one GRPO step on the GPU, fp32 and BF16, on a small random model ----
tok="$SRC/tests/fixtures/tokenizers/bytes-chatml"
"$M" init "$tok/config.json" "$OUTD/tiny" --tokenizer-from "$tok" --seed 11 --std 0.1 >"$OUTD/init.log" 2>&1
grpo_step() {
    local name="$1"
    shift
    rm -rf "${OUTD:?}/$name"
    "$W" actor_rollout_ref.model.path="$OUTD/tiny" trainer.device=cuda trainer.total_training_steps=2 \
        trainer.default_local_dir="$OUTD/$name" trainer.project_name=p trainer.experiment_name=e \
        trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 data.train_batch_size=8 \
        actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=8 data.max_response_length=64 \
        data.synthetic.num_train=32 data.synthetic.num_val=4 "$@"
}
step_figures() {
    python3 - "$OUTD/$1/p/e/metrics.jsonl" <<'PY' 2>/dev/null || echo "no metrics"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
r = rows[-1]
keys = [k for k in r if k.startswith("timing_s/") or k.startswith("perf/throughput")]
print(", ".join("%s %.3g" % (k.split("/", 1)[1], r[k]) for k in sorted(keys)))
PY
}
export -f grpo_step
for prec in fp32 bf16; do
    extra=()
    [ "$prec" = bf16 ] && extra=(actor_rollout_ref.actor.dtype=bfloat16)
    step "step-$prec" "$([ "$emulate" = 1 ] && echo 240 || echo 60)" grpo_step "step-$prec" "${extra[@]}" &&
        notes+=("step-$prec (2 steps, 64 sequences of up to 64 tokens; the last step): $(step_figures "step-$prec")")
done

# ---- NCCL on one GPU: a 1-rank communicator; 2 ranks on it, which NCCL refuses ----
nccl_smoke() {
    mpirun -np 1 "$K" --nccl || return
    echo "-- 2 ranks on one GPU:"
    mpirun -np 2 "$K" --nccl
    local r=$?
    [ $r = 77 ] && echo "2 ranks on one GPU: NCCL refuses two ranks on one device (test_gpu_kernels skips it, as expected)"
    [ $r = 0 ] || [ $r = 77 ]
}
export -f nccl_smoke
STEP_NOTE="1 rank" step nccl 45 nccl_smoke

# ---- the whole-run suites, with the time left ----
[ -f "$bundled" ] && [ "$emulate" != 1 ] && export GRPO_BUNDLED_MODEL="$bundled"
step gpu-model 120 "$B/tests/gpu/test_gpu_model" ${GRPO_BUNDLED_MODEL:+"$GRPO_BUNDLED_MODEL"}
step gpu-run 300 tests/gpu/test_gpu_run.sh
step gpu-dist 300 tests/gpu/test_gpu_dist.sh
step gpu-ring-np2 120 mpirun -np 2 "$K" --ring
for mode in ep sp cp; do
    step "gpu-${mode}2-np2" 120 mpirun -np 2 "$B/tests/gpu/test_gpu_parallel" "--$mode"
done
step gpu-par-runs 300 tests/gpu/test_gpu_par_runs.sh
exit $rc
