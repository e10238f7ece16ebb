#!/usr/bin/env bash
# grpo-worker as an operator meets it: --help, --print-config with a file and
# overrides, clear errors with exit code 2 for bad input, the MPI selftest.
set -u
. "$(dirname "$0")/../lib.sh" grpo-worker-cli
worker="$(prog grpo-worker)"

"$worker" --help >"$TMP/help" 2>&1
expect "--help exits 0 and documents overrides" $(( $? != 0 )) 
has "$TMP/help" "key.path=value"; expect "--help mentions key.path=value" $?

cat >"$TMP/run.yaml" <<'Y'
data:
  train_batch_size: 16
actor_rollout_ref:
  rollout:
    n: 4
Y
"$worker" --config "$TMP/run.yaml" actor_rollout_ref.rollout.n=6 --print-config >"$TMP/out" 2>&1
expect "--print-config exits 0" $?
has "$TMP/out" "train_batch_size: 16  # $TMP/run.yaml:2"; expect "file value with its origin" $?
has "$TMP/out" "n: 6  # command line"; expect "override beats file" $?

printf 'data:\n  train_bach_size: 4\n' >"$TMP/bad.yaml"
"$worker" --config "$TMP/bad.yaml" >"$TMP/err" 2>&1
rc=$?
[ $rc -eq 2 ]; expect "unknown key exits 2 (got $rc)" $?
has "$TMP/err" "bad.yaml:2: unknown key 'data.train_bach_size' (did you mean 'data.train_batch_size'?)"
expect "unknown key error names file, line and suggestion" $?

"$worker" algorithm.adv_estimator=ppo >"$TMP/err" 2>&1
[ $? -eq 2 ]; expect "bad enum exits 2" $?
has "$TMP/err" "command line: algorithm.adv_estimator must be one of grpo|grpo_vectorized|rloo|rloo_vectorized|"
expect "bad enum error lists the choices" $?
"$worker" algorithm.adv_estimator=gae >"$TMP/err" 2>&1
[ $? -eq 2 ] && has "$TMP/err" "command line: algorithm.adv_estimator=gae: GAE needs a critic"
expect "a verl value that does not run here says why (exit 2)" $?

"$worker" --config "$TMP/missing.yaml" >"$TMP/err" 2>&1
[ $? -eq 2 ]; expect "missing config file exits 2" $?
has "$TMP/err" "cannot open config file '$TMP/missing.yaml'"; expect "missing file named" $?

"$worker" stray-argument >"$TMP/err" 2>&1
[ $? -eq 2 ]; expect "stray argument exits 2" $?

mpirun --oversubscribe -np 4 "$worker" --selftest --tp 2 --pp 2 >"$TMP/st" 2>&1
expect "mpirun selftest tp=2 pp=2" $?
has "$TMP/st" "collective plane OK: 4 ranks (dp=1 tp=2 pp=2)"; expect "selftest reports the layout" $?
# the MPI's capability, said once at start: Debian's Open MPI 4.1 has no ULFM (scripts/mpirun_ft, tests/ft)
[ "$(lines_with "$TMP/st" "without ULFM: trainer-loss survival is unavailable with this MPI")" -eq 1 ] &&
    has "$TMP/st" "MPI: Open MPI v4."
expect "rank 0 says once that trainer-loss survival is unavailable with Open MPI 4.1" $?

mpirun --oversubscribe -np 3 "$worker" --selftest --tp 2 >"$TMP/st" 2>&1
[ $? -ne 0 ]; expect "impossible layout fails" $?
has "$TMP/st" "3 ranks cannot be split into tp=2 x pp=1"; expect "impossible layout explained" $?

# docs/verl.md's worked example: verl's GSM8K GRPO overrides, unchanged (the shell leaves the quotes of the
# logger list in place, as it does in verl's scripts)
"$worker" --print-config algorithm.adv_estimator=grpo data.train_files=/data/gsm8k/train.parquet \
    data.val_files=/data/gsm8k/test.parquet data.train_batch_size=1024 data.max_prompt_length=512 \
    data.max_response_length=1024 data.filter_overlong_prompts=True data.truncation='error' \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40 actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40 actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40 actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.use_kl_in_reward=False trainer.critic_warmup=0 "trainer.logger=['console','wandb']" \
    trainer.project_name=verl_grpo_example_gsm8k trainer.experiment_name=qwen2_5_3b_function_rm \
    trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15 \
    >"$TMP/verl" 2>&1
expect "verl's GSM8K example runs unchanged" $?
[ "$(grep -c '^#   ' "$TMP/verl")" -eq 6 ]; expect "its 6 keys for verl's machinery are listed with the reason" $?
[ -z "$(grep -E '^[a-z_]+:' "$TMP/verl" | sort | uniq -d)" ]; expect "--print-config prints each top-level block once" $?
has "$TMP/verl" 'logger: ["console", "wandb"]'; expect "trainer.logger keeps verl's list, printed as a YAML list" $?
"$worker" --print-config "actor_rollout_ref.rollout.single_turn_response_length=4096" >"$TMP/mt" 2>&1
[ $? -eq 2 ] && has "$TMP/mt" "single_turn_response_length=4096: a per-turn response budget in multi-turn rollouts"
expect "a verl feature we lack is refused by name (exit 2)" $?

# when OpenBLAS chose older kernels than the CPU runs, the worker runs itself again with better ones
# (kernels/cpu/blas_select.c): the new image keeps its name, grpo-worker, which pgrep, pkill and the tests that
# signal workers match (it was "exe" when re-run through /proc/self/exe). The worker then waits for a grpod that
# is not there (it retries for grpod.connect_timeout_s), so it is caught alive after the re-run.
if grep -qw avx2 /proc/cpuinfo; then
    env -u OPENBLAS_CORETYPE GRPO_BLAS_PRETEND_CORE=Prescott "$worker" grpod.endpoint="ipc://$TMP/no-grpod.sock" \
        grpod.connect_timeout_s=120 >"$TMP/reexec" 2>&1 &
    pid=$!
    rerun() { tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx GRPO_BLAS_REEXEC=1; }
    wait_for 20 rerun; rc=$?
    name="$(cat "/proc/$pid/comm" 2>/dev/null)"
    [ $rc -eq 0 ] && [ "$name" = grpo-worker ]
    expect "a worker re-run for better BLAS kernels is still named grpo-worker (got '$name')" $?
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
fi

finish
