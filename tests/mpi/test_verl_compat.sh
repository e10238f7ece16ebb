#!/usr/bin/env bash
# verl keys from real launch scripts (issue 40 items 12-13), on a tiny model:
#  - verl's deprecated global micro-batch keys (actor.ppo_micro_batch_size, rollout.log_prob_micro_batch_size,
#    ref.log_prob_micro_batch_size) mean the _per_gpu keys times the DP size: 2 colocated DP ranks given the
#    global 4 train bit for bit as with _per_gpu=2, and say the deprecation once; both keys at once, or a global
#    micro-batch smaller than the DP size, are refused naming the keys;
#  - actor_rollout_ref.rollout.val_kwargs.top_k: sampling among the 1 most likely token is greedy decoding, so a
#    validation with do_sample, temperature 1, top_k=1 and n=2 scores exactly as the greedy one (mean@2 = mean@1),
#    while top_k=-1 samples (another score).
# usage: test_verl_compat.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/dist_lib.sh" verl-compat
STEPS=2
COMMON=(actor_rollout_ref.model.path="$TMP/tiny" trainer.project_name=p trainer.experiment_name=e
    trainer.total_training_steps=$STEPS trainer.val_before_train=false trainer.test_freq=-1
    data.train_batch_size=4 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2
    data.max_response_length=12 actor_rollout_ref.actor.optim.lr=1e-3 data.synthetic.shots=0 data.synthetic.num_train=64
    data.synthetic.num_val=8 actor_rollout_ref.actor.use_kl_loss=true
    custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score)
weights() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor"; }
PER=(actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2)
GLOBAL=(actor_rollout_ref.actor.ppo_micro_batch_size=4 actor_rollout_ref.rollout.log_prob_micro_batch_size=4
    actor_rollout_ref.ref.log_prob_micro_batch_size=4)

"${MPIRUN[@]}" -np 2 "$WORKER" "${COMMON[@]}" "${PER[@]}" trainer.default_local_dir="$TMP/per" >"$TMP/per.log" 2>&1
expect "2 colocated ranks with the _per_gpu keys" $?
"${MPIRUN[@]}" -np 2 "$WORKER" "${COMMON[@]}" "${GLOBAL[@]}" trainer.default_local_dir="$TMP/global" \
    >"$TMP/global.log" 2>&1
expect "2 colocated ranks with verl's global keys" $?
"$COMPARE" "$(weights per)" "$(weights global)" 0 >"$TMP/cmp.txt" 2>&1
chk=$?; expect "... the same weights, bit for bit ($(tail -1 "$TMP/cmp.txt"))" $chk
says "$TMP/global.log" "actor_rollout_ref.actor.ppo_micro_batch_size is deprecated (as in verl): it is divided by the 2 data-parallel trainer ranks, 2 sequences each"
expect "... saying the deprecation and the per-rank size" $?
[ "$(grep -c "ppo_micro_batch_size is deprecated" "$TMP/global.log")" -eq 1 ]; expect "... once" $?
"$WORKER" "${COMMON[@]}" actor_rollout_ref.actor.ppo_micro_batch_size=4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 trainer.default_local_dir="$TMP/both" >"$TMP/both.log" 2>&1
[ $? -eq 2 ]; expect "both micro-batch keys: a configuration error" $?
says "$TMP/both.log" "actor_rollout_ref.actor.ppo_micro_batch_size and actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (command line) are both set"
expect "... naming both" $?
"${MPIRUN[@]}" -np 2 "$WORKER" "${COMMON[@]}" actor_rollout_ref.ref.log_prob_micro_batch_size=1 \
    trainer.default_local_dir="$TMP/small" >"$TMP/small.log" 2>&1
[ $? -ne 0 ]; expect "a global micro-batch smaller than the DP size is refused" $?
says "$TMP/small.log" "actor_rollout_ref.ref.log_prob_micro_batch_size=1 is a micro-batch over all 2 data-parallel ranks"
expect "... naming the key and the DP size" $?

# validation's top-k
val_mean() { # LOG-DIR N: the first val-core reward mean@N in its metrics.jsonl
    python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    for k, v in r.items():
        if k.startswith("val-core/") and k.endswith("/reward/mean@" + sys.argv[2]):
            print(repr(v)); sys.exit(0)
sys.exit(1)' "$TMP/$1/p/e/metrics.jsonl" "$2"
}
VAL=("${COMMON[@]}" trainer.total_training_steps=1 trainer.val_before_train=true)
"$WORKER" "${VAL[@]}" trainer.default_local_dir="$TMP/greedy" >"$TMP/greedy.log" 2>&1
expect "greedy validation" $?
SAMPLE=(actor_rollout_ref.rollout.val_kwargs.do_sample=true actor_rollout_ref.rollout.val_kwargs.temperature=1.0
    actor_rollout_ref.rollout.val_kwargs.n=2)
"$WORKER" "${VAL[@]}" "${SAMPLE[@]}" actor_rollout_ref.rollout.val_kwargs.top_k=1 \
    trainer.default_local_dir="$TMP/top1" >"$TMP/top1.log" 2>&1
expect "validation sampling with val_kwargs.top_k=1 runs" $?
"$WORKER" "${VAL[@]}" "${SAMPLE[@]}" actor_rollout_ref.rollout.val_kwargs.top_k=-1 \
    trainer.default_local_dir="$TMP/all" >"$TMP/all.log" 2>&1
expect "validation sampling with val_kwargs.top_k=-1 runs" $?
g="$(val_mean greedy 1)" t1="$(val_mean top1 2)" a="$(val_mean all 2)"
[ -n "$g" ] && [ "$g" = "$t1" ]; expect "top_k=1 sampling scores as greedy decoding ($t1 = $g)" $?
[ -n "$a" ] && [ "$a" != "$g" ]; expect "top_k=-1 samples from every token (score $a, greedy $g)" $?
finish
