#!/usr/bin/env bash
# Whole GRPO runs with trainer.device=cuda (one process: generation, update and AdamW on the GPU) against the same
# runs on the CPU, on a tiny random model:
#  - the run says it runs on cuda, finishes its steps and logs verl's memory counters of the device;
#  - step 1 (the same prompts; the sampled tokens compared through the rollout dumps) agrees with the CPU run:
#    with identical responses, the loss, gradient norm and entropy within fp32 (cuBLAS) or BF16 bounds;
#  - a run stopped after step 1 and resumed from its checkpoint ends bit-identical to the run that went straight
#    through (the kernels are deterministic), and its checkpoint loads on the CPU; a CPU run's checkpoint resumes
#    on the GPU;
#  - gradient checkpointing with activation offload gives the weights of checkpointing alone, bit for bit;
#  - the supervised warm-start, its reference policy and GRPO after it run on the GPU too.
# Skipped (77) without a CUDA device.
# GRPO_TEST_DEVICE=cpu runs the same script with trainer.device=cpu (its own plumbing, on a machine without a GPU).
# usage: test_gpu_run.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/gpu_lib.sh" grpo-gpu-run
cuda_says() { [ "$DEV" != cuda ] || grep -q "$1" "$2"; } # the cuda context's log line (the CPU's fp32 one logs none)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tiny_model "$TMP/policy"
expect "tiny policy initialised" $?
COMMON=(actor_rollout_ref.model.path="$TMP/policy" trainer.project_name=p trainer.experiment_name=e
    trainer.val_before_train=false trainer.test_freq=-1 data.train_batch_size=4 actor_rollout_ref.rollout.n=4
    actor_rollout_ref.actor.ppo_mini_batch_size=4 data.max_response_length=12 data.synthetic.shots=0 data.synthetic.num_train=64
    data.synthetic.num_val=4 custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score
    actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.01 trainer.save_freq=1)
# run NAME OVERRIDES...: output in $TMP/NAME.log, the run under $TMP/NAME
run() {
    local name="$1"
    shift
    timeout "$(scaled 300)" "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/$name" \
        trainer.rollout_data_dir="$TMP/$name/rollouts" "$@" >"$TMP/$name.log" 2>&1
}
run cpu trainer.total_training_steps=2
expect "the CPU run finishes" $?
run gpu trainer.total_training_steps=2 trainer.device=$DEV
expect "the cuda run finishes" $?
cuda_says "kernels: cuda" "$TMP/gpu.log"
rc=$?
expect "it says it runs on cuda ($(grep -m1 -o 'kernels: cuda.*' "$TMP/gpu.log"))" $rc
run gpu-bf16 trainer.total_training_steps=2 trainer.device=$DEV actor_rollout_ref.actor.dtype=bfloat16
expect "the cuda run with BF16 GEMMs finishes" $?
cuda_says "kernels: cuda.*BF16" "$TMP/gpu-bf16.log"
expect "it says BF16 GEMMs run on cuda" $?

# step 1 against the CPU: the same responses (the sampler draws its uniforms on the host), then the numbers
python3 - "$TMP" <<'PY'
import json, sys
tmp = sys.argv[1]
def step(run, k):
    return [json.loads(l) for l in open(f"{tmp}/{run}/p/e/metrics.jsonl")][k - 1]
def responses(run):
    out = []
    for l in open(f"{tmp}/{run}/rollouts/1.jsonl"):
        r = json.loads(l)
        out.append((r["prompt_ids"], r["response_ids"]))
    return out
cpu = responses("cpu")
ok = True
for run, bound in (("gpu", {"actor/pg_loss": 1e-3, "actor/grad_norm": 1e-3, "actor/entropy": 1e-4}),
                   ("gpu-bf16", {"actor/pg_loss": 5e-2, "actor/grad_norm": 1e-1, "actor/entropy": 1e-2})):
    same = responses(run) == cpu and len(cpu) > 0
    print(f"{run}: step 1's {len(cpu)} responses {'identical to' if same else 'differ from'} the CPU run's")
    a, b = step("cpu", 1), step(run, 1)
    for k in bound:
        rel = abs(a[k] - b[k]) / max(abs(a[k]), 1e-2)
        print(f"  {k}: cpu {a[k]:.6g}, {run} {b[k]:.6g} (relative {rel:.2e}, bound {bound[k]:g})")
        if same and rel >= bound[k]:
            ok = False
    if run == "gpu" and not same:  # fp32 on both sides: a flipped token would say the GPU's logits are off
        ok = False
    for r in (step(run, 1), step(run, 2)):
        if not (r["perf/max_memory_allocated_gb"] > 0 and r["perf/max_memory_reserved_gb"] >= r["perf/max_memory_allocated_gb"]):
            print("  memory counters missing:", {k: v for k, v in r.items() if k.startswith("perf/max_memory")})
            ok = False
sys.exit(0 if ok else 1)
PY
expect "step 1 agrees with the CPU (fp32: identical responses, 1e-3; BF16: its bounds); memory logged" $?

# exact resume on the GPU: one step, stop, resume for the second
run resume trainer.total_training_steps=1 trainer.device=$DEV
expect "a one-step cuda run finishes" $?
run resume trainer.total_training_steps=2 trainer.device=$DEV trainer.resume_mode=auto
expect "it resumes for step 2" $?
grep -q "resumed from" "$TMP/resume.log"
expect "from its checkpoint" $?
"$COMPARE" "$TMP/gpu/p/e/checkpoints/global_step_2/actor" "$TMP/resume/p/e/checkpoints/global_step_2/actor" 0
expect "the resumed run's weights are bit-identical to the straight run's (and load on the CPU)" $?
cmp -s "$TMP/gpu/p/e/checkpoints/global_step_2/optim.bin" "$TMP/resume/p/e/checkpoints/global_step_2/optim.bin"
expect "so is AdamW's state" $?
"$COMPARE" "$TMP/cpu/p/e/checkpoints/global_step_2/actor" "$TMP/gpu/p/e/checkpoints/global_step_2/actor" 1e-3
expect "the cuda run's weights after 2 steps are within 1e-3 of the CPU run's" $?

# a CPU run's checkpoint resumed on the GPU (the files are the same whichever device wrote them)
run cross trainer.total_training_steps=2 trainer.device=$DEV trainer.resume_mode=resume_path \
    trainer.resume_from_path="$TMP/cpu/p/e/checkpoints/global_step_1"
expect "the CPU run's step-1 checkpoint resumes on cuda" $?
"$COMPARE" "$TMP/cpu/p/e/checkpoints/global_step_2/actor" "$TMP/cross/p/e/checkpoints/global_step_2/actor" 1e-3
expect "and its step 2 ends within 1e-3 of the CPU's" $?

# gradient checkpointing, with and without activation offload to pinned host memory: the same weights, bit for bit
run ckpt trainer.total_training_steps=2 trainer.device=$DEV actor_rollout_ref.model.enable_gradient_checkpointing=true
expect "a checkpointed cuda run finishes" $?
run offload trainer.total_training_steps=2 trainer.device=$DEV actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.model.enable_activation_offload=true
expect "with activation offload too" $?
"$COMPARE" "$TMP/ckpt/p/e/checkpoints/global_step_2/actor" "$TMP/offload/p/e/checkpoints/global_step_2/actor" 0
expect "offload changes no bit of the weights" $?

# the supervised warm-start (its reference kept for KL), then GRPO, on the GPU
run sft trainer.total_training_steps=2 trainer.sft_warmup_steps=2 trainer.device=$DEV
expect "a warm-started cuda run finishes" $?
[ -f "$TMP/sft/p/e/reference/config.json" ]
expect "its reference policy was written" $?

finish
