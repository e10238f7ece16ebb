#!/usr/bin/env bash
# Batch-invariant mode (actor_rollout_ref.model.batch_invariant, docs/training.md): the rollout's log-probs equal
# the trainer's old log-probs (a pass of their own: two mini-batches a step) bit for bit, read from the audit files,
# and verl's mismatch metrics (training/rollout_probs_diff_*, rollout_corr/kl, k3_kl, log_ppl_diff, chi2_token) are
# exactly 0 as recomputed in float64 by check_batch_invariant.py, in every layout:
#  - one process (and on policy, where the update's forward gives the old log-probs); split (1 trainer + 1 rollout rank); rollout TP2 fed by a TP1 trainer; TP2 trainers fed by a TP1
#    rollout rank; rollout TP2 fed by TP2 trainers; colocated TP2; BF16 products (dtype bfloat16 for the actor and the
#    rollout: skipped, saying so, on a CPU without AVX512-BF16 or AMX);
#  - context parallelism (colocated CP2), a mixture of experts (Qwen3-MoE) under training TP (TP2 trainers fed by a
#    TP1 rollout rank) and under expert parallelism (colocated EP2, and EP2 trainers fed by an EP1 rollout rank),
#    and LoRA with rollout TP (rollout TP2, merged weights, fed by a TP1 trainer; and on a
#    Qwen3-MoE model, the experts' and the router's adapters merged too, also under EP2: colocated, and EP2
#    trainers fed by an EP1 rollout rank);
#  - with the mode off the same runs show the real difference: nonzero, and the metrics equal its recomputation;
#  - use_rollout_log_probs=true in the mode skips the old-log-prob pass and changes no metric, bit for bit (one
#    process and split).
# usage: test_batch_invariant.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/dist_lib.sh" grpo-binv
CHECK="$(dirname "$0")/check_batch_invariant.py"
COMMON=(actor_rollout_ref.model.path="$TMP/tiny" trainer.project_name=p trainer.experiment_name=e
    trainer.total_training_steps=2 trainer.val_before_train=false trainer.test_freq=-1 data.train_batch_size=4
    actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2 data.max_response_length=12
    data.synthetic.shots=0 data.synthetic.num_train=64 data.synthetic.num_val=4
    custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score)
ON=actor_rollout_ref.model.batch_invariant=true
SKIP=actor_rollout_ref.actor.use_rollout_log_probs=true

# run NAME CHECK_MODE [REF] LAUNCH... -- OVERRIDES...: a 2-step run writing its audit files, then the check
run() {
    local name=$1 mode=$2 ref="" launch=()
    shift 2
    [ "$mode" = skip ] && { ref=$TMP/$1/p/e; shift; }
    while [ "$1" != "--" ]; do launch+=("$1"); shift; done
    shift
    timeout "$(scaled 300)" "${launch[@]}" "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/$name" \
        trainer.rollout_data_dir="$TMP/$name/audit" "$@" >"$TMP/$name.log" 2>&1 ||
        { echo "     the run failed:"; tail -3 "$TMP/$name.log" | sed 's/^/     | /'; return 1; }
    # shellcheck disable=SC2086 # ref: empty or one word
    python3 "$CHECK" "$mode" "$TMP/$name/p/e" "$TMP/$name/audit" 2 $ref >"$TMP/$name.check" 2>&1 ||
        { sed 's/^/     | /' "$TMP/$name.check"; return 1; }
}
SPLIT=("${MPIRUN[@]}" -np 2)

run one-off off -- actor_rollout_ref.model.batch_invariant=false
expect "one process, the mode off: the rollout's log-probs differ from the trainer's, as the metrics say" $?
run one-on on -- $ON
expect "one process: the rollout's log-probs are the trainer's bit for bit, the mismatch metrics exactly 0" $?
run one-skip skip one-on -- $ON $SKIP
expect "... use_rollout_log_probs skips the old-log-prob pass and every metric is the same, bit for bit" $?
run one-onpol onpol -- $ON actor_rollout_ref.actor.ppo_mini_batch_size=4
expect "one process on policy (one optimizer step: the update's forward gives the old log-probs): bit for bit" $?

run split-off off "${SPLIT[@]}" -- placement.trainer_ranks=1 placement.rollout_ranks=1
expect "split (1 trainer + 1 rollout rank), the mode off: a real difference" $?
run split-on on "${SPLIT[@]}" -- placement.trainer_ranks=1 placement.rollout_ranks=1 $ON
expect "split: bit for bit, the metrics exactly 0" $?
run split-skip skip split-on "${SPLIT[@]}" -- placement.trainer_ranks=1 placement.rollout_ranks=1 $ON $SKIP
expect "... split with use_rollout_log_probs: no pass, the same metrics" $?

run rtp-off off "${MPIRUN[@]}" -np 3 -- placement.trainer_ranks=1 placement.rollout_ranks=2 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2
expect "rollout TP2 fed by a TP1 trainer, the mode off: a real difference" $?
run rtp-on on "${MPIRUN[@]}" -np 3 -- placement.trainer_ranks=1 placement.rollout_ranks=2 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 $ON
expect "rollout TP2 fed by a TP1 trainer: bit for bit" $?
run ttp-on on "${MPIRUN[@]}" -np 3 -- placement.trainer_ranks=2 placement.rollout_ranks=1 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 $ON
expect "TP2 trainers fed by a TP1 rollout rank: bit for bit" $?
run tp22-on on "${MPIRUN[@]}" -np 4 -- placement.trainer_ranks=2 placement.rollout_ranks=2 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 $ON
expect "rollout TP2 fed by TP2 trainers: bit for bit" $?
run coltp-on on "${SPLIT[@]}" -- actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 $ON
expect "colocated TP2 (2 ranks generating and training): bit for bit" $?

# context parallelism: the ring's blocks merged by log-sum-exp without the mode, the whole row's keys in the mode
CP=(actor_rollout_ref.actor.megatron.context_parallel_size=2)
run cp-off off "${SPLIT[@]}" -- "${CP[@]}"
expect "colocated CP2, the mode off: a real difference" $?
run cp-on on "${SPLIT[@]}" -- "${CP[@]}" $ON
expect "colocated CP2 (the ring's chunks, each row over the whole row's keys in the mode): bit for bit" $?

# a mixture of experts under training TP: the experts' down projections' partials in the fixed groups
tiny_moe_model "$TMP/moe" qwen3_moe
expect "tiny Qwen3-MoE model initialised" $?
MOE=(actor_rollout_ref.model.path="$TMP/moe" placement.trainer_ranks=2 placement.rollout_ranks=1
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2)
run moe-ttp-off off "${MPIRUN[@]}" -np 3 -- "${MOE[@]}"
expect "Qwen3-MoE: TP2 trainers fed by a TP1 rollout rank, the mode off: a real difference" $?
run moe-ttp-on on "${MPIRUN[@]}" -np 3 -- "${MOE[@]}" $ON
expect "Qwen3-MoE: TP2 trainers fed by a TP1 rollout rank (the experts' groups): bit for bit" $?

# expert parallelism: each expert's groups sent home apart in the mode and combined there as without EP
EP=(actor_rollout_ref.model.path="$TMP/moe" actor_rollout_ref.actor.megatron.expert_model_parallel_size=2)
run moe-ep-off off "${SPLIT[@]}" -- "${EP[@]}"
expect "Qwen3-MoE: colocated EP2 (the rollout generating with every expert), the mode off: a real difference" $?
run moe-ep-on on "${SPLIT[@]}" -- "${EP[@]}" $ON
expect "Qwen3-MoE: colocated EP2 (the experts' groups combined at the token's rank): bit for bit" $?
run moe-eptr-off off "${MPIRUN[@]}" -np 3 -- "${EP[@]}" placement.trainer_ranks=2 placement.rollout_ranks=1
expect "Qwen3-MoE: EP2 trainers fed by an EP1 rollout rank, the mode off: a real difference" $?
run moe-eptr-on on "${MPIRUN[@]}" -np 3 -- "${EP[@]}" placement.trainer_ranks=2 placement.rollout_ranks=1 $ON
expect "Qwen3-MoE: EP2 trainers fed by an EP1 rollout rank: bit for bit" $?

# LoRA with rollout TP: the rollout's weights have the adapter merged; in the mode the trainer's too
LORA=(placement.trainer_ranks=1 placement.rollout_ranks=2 actor_rollout_ref.rollout.tensor_model_parallel_size=2
    actor_rollout_ref.model.lora_rank=8 actor_rollout_ref.model.lora_alpha=16 actor_rollout_ref.actor.optim.lr=1e-2)
run lora-rtp-off off "${MPIRUN[@]}" -np 3 -- "${LORA[@]}"
expect "LoRA: rollout TP2 (merged weights) fed by a TP1 trainer, the mode off: a real difference" $?
run lora-rtp-on on "${MPIRUN[@]}" -np 3 -- "${LORA[@]}" $ON
expect "LoRA: rollout TP2 fed by a TP1 trainer (the trainer's forward on the merged weights too): bit for bit" $?
MOELORA=(actor_rollout_ref.model.path="$TMP/moe" "${LORA[@]}")
run moelora-rtp-off off "${MPIRUN[@]}" -np 3 -- "${MOELORA[@]}"
expect "Qwen3-MoE with LoRA on every projection, the experts and the router: rollout TP2, the mode off: a difference" $?
run moelora-rtp-on on "${MPIRUN[@]}" -np 3 -- "${MOELORA[@]}" $ON
expect "Qwen3-MoE with LoRA on the experts and the router: rollout TP2 fed by a TP1 trainer: bit for bit" $?
# under EP each rank merges its own experts' adapters
EPLORA=("${EP[@]}" actor_rollout_ref.model.lora_rank=8 actor_rollout_ref.model.lora_alpha=16
    actor_rollout_ref.actor.optim.lr=1e-2)
run moelora-ep-off off "${SPLIT[@]}" -- "${EPLORA[@]}"
expect "Qwen3-MoE with LoRA: colocated EP2, the mode off: a real difference" $?
run moelora-ep-on on "${SPLIT[@]}" -- "${EPLORA[@]}" $ON
expect "Qwen3-MoE with LoRA: colocated EP2 (each rank's experts' adapters merged): bit for bit" $?
run moelora-eptr-on on "${MPIRUN[@]}" -np 3 -- "${EPLORA[@]}" placement.trainer_ranks=2 placement.rollout_ranks=1 $ON
expect "Qwen3-MoE with LoRA: EP2 trainers fed by an EP1 rollout rank: bit for bit" $?

if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
    BF16=(actor_rollout_ref.actor.dtype=bfloat16 actor_rollout_ref.rollout.dtype=bfloat16)
    run bf16-off off -- "${BF16[@]}"
    expect "BF16 products, the mode off: a real difference" $?
    run bf16-on on -- "${BF16[@]}" $ON
    expect "BF16: bit for bit, the metrics exactly 0" $?
    grep -q "BF16 GEMMs" "$TMP/bf16-on.log"
    expect "... the BF16 run said its BF16 GEMMs run (the backward's)" $?
else
    echo "SKIP BF16 checks: this CPU has neither AVX512-BF16 nor AMX (no BF16 products to compare)"
fi
finish
