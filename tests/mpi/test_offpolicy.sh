#!/usr/bin/env bash
# verl v0.9's rollout correction, policy loss modes and advantage estimators on a tiny model, each run's audit files
# and metrics recomputed in float64 by check_offpolicy.py (verl's formulas, transcribed there):
#  - every loss mode (vanilla, gspo, sapo, gpg, clip_cov, kl_cov, geo_mean, dro, cispo, dppo_tv, dppo_kl) and every
#    estimator (grpo, grpo_vectorized, rloo, rloo_vectorized, reinforce_plus_plus with and without a discount,
#    reinforce_plus_plus_baseline, opo, grpo_passk, gpg, remax, optimal_token_baseline, tir_optimal_token_baseline,
#    gdpo) in one process: the advantages of every token, the step's pg_loss at the old policy, the rollout_corr/
#    diagnostics;
#  - remax's baseline: at temperature 0 (every sampled response the greedy one) it is each response's own reward;
#    with a rollout rank (1 + 1) it travels with the sequences;
#  - the optimal token baselines one step off (1 rollout + 1 trainer rank) with token rejection and IS weights:
#    masks with holes (where the two forms differ), zero tails, the IS weights in the path variance;
#  - gdpo on 2 colocated DP ranks: a Python scorer's dict components, the whitening and gdpo/ metrics over the step;
#  - decoupled rollout correction in one process (token TIS with rejection by token_k2 and seq_mean_k1, whose gaps
#    are the trainer's rounding: thresholds at that scale), on 2 colocated DP ranks (sequence-level IcePop,
#    batch-normalised, token_k1 and seq_sum_k2 rejection, REINFORCE++'s whitening: every figure over the whole step,
#    summed over the ranks), and one step off (1 rollout + 1 trainer rank, rollout.mode=async, real gaps): the IS
#    weights, the rejection masks, every rollout_corr/ metric, the advantages on the tokens kept and the loss;
#  - bypass mode (ppo_clip, and reinforce with sequence IS and rejection): the loss against the rollout's log-probs,
#    its rollout_corr/ metrics averaged over the micro-batches;
#  - what is refused, before any work, naming the key and the reason: gae, optimal_token_baseline without
#    calculate_sum_pi_squared or in bypass mode, gdpo without its keys, with weights that do not match them or with a
#    scorer of one score, loss_mode bypass_mode, dro without dro_beta, bypass mode with another loss mode or batch normalisation,
#    verl v0.7's rollout_rs=geometric and its token veto, a malformed threshold.
# usage: test_offpolicy.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/dist_lib.sh" grpo-offpol
CHECK="$(dirname "$0")/check_offpolicy.py"
COMMON=(actor_rollout_ref.model.path="$TMP/tiny" trainer.project_name=p trainer.experiment_name=e
    trainer.total_training_steps=2 trainer.val_before_train=false trainer.test_freq=-1 data.train_batch_size=4
    actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=4 data.max_response_length=12
    data.synthetic.shots=0 data.synthetic.num_train=64 data.synthetic.num_val=4
    custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score)

# run NAME STEPS LAUNCH... -- OVERRIDES...: a run writing its audit files, then the float64 check of its steps (with
# $CHECK_ARGS, the checker's own options, when set)
run() {
    local name=$1 steps=$2 launch=()
    shift 2
    while [ "$1" != "--" ]; do launch+=("$1"); shift; done
    shift
    timeout "$(scaled 300)" "${launch[@]}" "$WORKER" "${COMMON[@]}" trainer.total_training_steps="$steps" \
        trainer.default_local_dir="$TMP/$name" trainer.rollout_data_dir="$TMP/$name/audit" "$@" \
        >"$TMP/$name.log" 2>&1 || { echo "     the run failed:"; tail -3 "$TMP/$name.log" | sed 's/^/     | /'; return 1; }
    # shellcheck disable=SC2086 # CHECK_ARGS: words
    python3 "$CHECK" "$TMP/$name/p/e" "$TMP/$name/audit" "$steps" data.max_response_length=12 "$@" ${CHECK_ARGS:-} \
        >"$TMP/$name.check" 2>&1 || { sed 's/^/     | /' "$TMP/$name.check"; return 1; }
}
one() { local name=$1; shift; run "$name" 2 -- "$@"; }

for mode in vanilla gspo sapo gpg kl_cov geo_mean cispo dppo_tv dppo_kl; do
    one "mode-$mode" actor_rollout_ref.actor.policy_loss.loss_mode=$mode
    expect "loss_mode=$mode: the loss at the old policy and the advantages agree with the float64 recomputation" $?
done
one mode-dro actor_rollout_ref.actor.policy_loss.loss_mode=dro actor_rollout_ref.actor.policy_loss.dro_beta=0.5
expect "loss_mode=dro agrees" $?
# clip_cov over one micro-batch of the step's 16 sequences, every candidate cut: pg_clipfrac is their share
one mode-clip_cov actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov \
    actor_rollout_ref.actor.policy_loss.clip_cov_ratio=1.0 actor_rollout_ref.actor.policy_loss.clip_cov_lb=0.0 \
    actor_rollout_ref.actor.policy_loss.clip_cov_ub=1.0 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
expect "loss_mode=clip_cov agrees, its cut tokens counted" $?
one mode-sapo-tau actor_rollout_ref.actor.policy_loss.loss_mode=sapo actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.tau_pos=2.0 actor_rollout_ref.actor.tau_neg=0.5
expect "sapo aggregates seq-mean-token-mean whatever loss_agg_mode says, with its tau keys" $?

for est in grpo_vectorized rloo rloo_vectorized reinforce_plus_plus reinforce_plus_plus_baseline opo grpo_passk gpg; do
    one "est-$est" algorithm.adv_estimator=$est actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean
    expect "adv_estimator=$est: every token's advantage agrees with the float64 recomputation" $?
done
one est-rpp-gamma algorithm.adv_estimator=reinforce_plus_plus algorithm.gamma=0.9
expect "reinforce_plus_plus discounts by algorithm.gamma" $?
one est-passk-dr algorithm.adv_estimator=grpo_passk algorithm.norm_adv_by_std_in_grpo=false
expect "grpo_passk without the std" $?

one est-remax algorithm.adv_estimator=remax
expect "adv_estimator=remax: the reward-to-go less the greedy response's reward agrees on every token" $?
# at temperature 0 every sampled response is the greedy one: the baseline is each response's own reward
one est-remax-greedy algorithm.adv_estimator=remax actor_rollout_ref.rollout.temperature=0
python3 - "$TMP/est-remax-greedy/audit" <<'PY'
import glob, json, sys
rows = [json.loads(l) for f in sorted(glob.glob(sys.argv[1] + "/*.jsonl")) for l in open(f) if l.strip()]
assert rows and all(r["reward_baseline"] == r["reward"] for r in rows), [(r["reward"], r["reward_baseline"]) for r in rows]
assert all(a == 0 for r in rows for a in r["advantages"])
print(len(rows), "greedy responses: each one's baseline is its own reward")
PY
expect "remax at temperature 0: the baseline is the greedy response's reward, scored as the sampled ones" $?
run remax-split 2 "${MPIRUN[@]}" -np 2 -- placement.trainer_ranks=1 placement.rollout_ranks=1 \
    algorithm.adv_estimator=remax
expect "remax with a rollout rank: the greedy baselines travel with the sequences" $?

for est in optimal_token_baseline tir_optimal_token_baseline; do
    one "est-$est" algorithm.adv_estimator=$est actor_rollout_ref.actor.calculate_sum_pi_squared=true
    expect "adv_estimator=$est: every token's advantage agrees, from the audit's sum_pi_squared" $?
done
python3 - "$TMP/est-optimal_token_baseline/audit/1.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:  # the old policy's: between its token's pi^2 and 1, and not the entropy (that lies above 0.1 here)
    assert len(r["sum_pi_squared"]) == len(r["response_ids"]), r
    assert all(math.exp(o) ** 2 <= s * (1 + 1e-5) and s < 0.1 for o, s in zip(r["old_log_probs"], r["sum_pi_squared"]))
print("sum_pi_squared in the audit: one per token, within [pi^2, 1]")
PY
expect "calculate_sum_pi_squared writes each token's sum of squared probabilities to the audit files" $?

# decoupled rollout correction in one process: the gaps are the trainer's rounding (1e-7), so are the thresholds
one rc-one algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=1.0 \
    algorithm.rollout_correction.rollout_rs=token_k2,seq_mean_k1 \
    algorithm.rollout_correction.rollout_rs_threshold=1e-12,0.9999999_1.0000001
expect "token TIS and rejection: weights, masks, metrics, advantages and loss agree" $?
one rc-geo actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean algorithm.rollout_correction.rollout_is=token \
    algorithm.rollout_correction.rollout_is_threshold=1.0
expect "geo_mean takes the geometric mean of a sequence's IS weights" $?
# shellcheck disable=SC2054 # the commas separate rollout_rs's options within one value
RC=(algorithm.adv_estimator=reinforce_plus_plus algorithm.rollout_correction.rollout_is=sequence
    algorithm.rollout_correction.rollout_is_threshold=0.9999995_1.0000005
    algorithm.rollout_correction.rollout_is_batch_normalize=true algorithm.rollout_correction.rollout_rs=token_k1,seq_sum_k2
    algorithm.rollout_correction.rollout_rs_threshold=0.9999995_1.0000005,1e-12)
run rc-colocated 2 "${MPIRUN[@]}" -np 2 -- trainer.nnodes=1 trainer.n_gpus_per_node=2 "${RC[@]}"
expect "2 colocated DP ranks: IcePop, batch normalisation, rejection and REINFORCE++ over the whole step" $?
# shellcheck disable=SC2054
ASYNC=(algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=1.05
    algorithm.rollout_correction.rollout_rs=seq_mean_k3,token_k1
    algorithm.rollout_correction.rollout_rs_threshold=0.1,0.5_2.0 actor_rollout_ref.actor.optim.lr=1e-3)
CHECK_ARGS=require_mixed=1 run rc-async 3 "${MPIRUN[@]}" -np 2 -- placement.trainer_ranks=1 \
    placement.rollout_ranks=1 actor_rollout_ref.rollout.mode=async "${ASYNC[@]}"
expect "one step off (real gaps): weights, masks, metrics, advantages and loss agree" $?
python3 - "$TMP/rc-async/p/e/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert [r["training/staleness"] for r in rows] == [0, 1, 1], rows
for r in rows[1:]:  # one version stale: the gap is real, some tokens truncated or rejected, some kept
    assert r["rollout_corr/kl"] > 1e-3 and 0 < r["rollout_corr/rollout_rs_masked_fraction"] < 1, r
    assert r["rollout_corr/rollout_is_ratio_fraction_high"] > 0, r
print("the stale steps' gap is measured and corrected")
PY
expect "one step off: a real gap, truncated and rejected in part" $?
# the optimal token baselines one step off: token rejection leaves holes in the masks (the two forms differ there)
# and unequal lengths (zero tails); the IS weights scale the path variance
for est in optimal_token_baseline tir_optimal_token_baseline; do
    CHECK_ARGS="require_mixed=1 require_holes=1" run "otb-async-$est" 3 "${MPIRUN[@]}" -np 2 -- \
        placement.trainer_ranks=1 placement.rollout_ranks=1 actor_rollout_ref.rollout.mode=async "${ASYNC[@]}" \
        algorithm.adv_estimator=$est actor_rollout_ref.actor.calculate_sum_pi_squared=true
    expect "$est one step off: token rejection's holes, zero tails and the IS weights in W agree" $?
done

# gdpo on 2 colocated DP ranks: each component of the Python scorer's dict normalised apart, the whitening and the
# gdpo/ metrics over the whole step
GDPO=(algorithm.adv_estimator=gdpo custom_reward_function.path="$(dirname "$0")/../fixtures/rewards/gdpo_reward.py"
    custom_reward_function.name=compute_score "+algorithm.gdpo_reward_keys=['byte_reward', 'len_reward']"
    "algorithm.gdpo_reward_weights=[1.0, 0.5]")
one est-gdpo "${GDPO[@]}"
expect "adv_estimator=gdpo: every token's advantage and the gdpo/ metrics agree" $?
one est-gdpo-dr "${GDPO[@]}" algorithm.norm_adv_by_std_in_grpo=false
expect "gdpo without the std (each component's r - mean)" $?
run gdpo-colocated 2 "${MPIRUN[@]}" -np 2 -- trainer.nnodes=1 trainer.n_gpus_per_node=2 "${GDPO[@]}"
expect "gdpo on 2 colocated DP ranks: the components travel, the whitening and metrics are the whole step's" $?

# bypass mode: the sampler's log-probs are the old policy (no old-log-prob pass)
one bypass-ppo algorithm.rollout_correction.bypass_mode=true
expect "bypass mode, ppo_clip: the loss against the rollout's log-probs" $?
one bypass-pg algorithm.rollout_correction.bypass_mode=true algorithm.rollout_correction.loss_type=reinforce \
    algorithm.rollout_correction.rollout_is=sequence algorithm.rollout_correction.rollout_rs=seq_max_k3 \
    algorithm.rollout_correction.rollout_rs_threshold=1.0
expect "bypass mode, reinforce with sequence IS: the loss -A log pi w" $?
python3 - "$TMP/bypass-pg/p/e/metrics.jsonl" "$TMP/bypass-pg.log" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    for k in ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_seq_max_k3_masked_fraction", "rollout_corr/kl"):
        assert k in r, (k, sorted(x for x in r if x.startswith("rollout_corr/")))
    assert "timing_s/old_log_prob" not in r or r["timing_s/old_log_prob"] == 0, r
    assert abs(r["rollout_corr/rollout_is_mean"] - 1) < 1e-4, r
print("bypass mode's metrics are the micro-batches'")
PY
expect "bypass mode logs its rollout_corr/ metrics and runs no old-log-prob pass" $?

# refusals: before any work (--print-config validates), naming the key and why
refused() {
    local want="$1"
    shift
    "$WORKER" "${COMMON[@]}" "$@" --print-config >"$TMP/refused.out" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && says "$TMP/refused.out" "$want"
}
refused "algorithm.adv_estimator=gae: GAE needs a critic" algorithm.adv_estimator=gae
expect "gae is refused" $?
refused "requires sum_pi_squared from actor: set actor_rollout_ref.actor.calculate_sum_pi_squared=true" \
    algorithm.adv_estimator=optimal_token_baseline
expect "optimal_token_baseline without calculate_sum_pi_squared is refused (verl's requirement)" $?
refused "bypass mode takes no old-log-prob pass" algorithm.adv_estimator=tir_optimal_token_baseline \
    actor_rollout_ref.actor.calculate_sum_pi_squared=true algorithm.rollout_correction.bypass_mode=true
expect "an optimal token baseline in bypass mode is refused" $?
refused "adv_estimator=gdpo requires algorithm.gdpo_reward_keys" algorithm.adv_estimator=gdpo
expect "gdpo without its keys is refused (verl's message)" $?
refused "algorithm.gdpo_reward_weights has 1 weights for 2 algorithm.gdpo_reward_keys" "${GDPO[@]}" \
    algorithm.gdpo_reward_weights=[2]
expect "gdpo with weights that do not match its keys is refused" $?
timeout "$(scaled 60)" "$WORKER" "${COMMON[@]}" algorithm.adv_estimator=gdpo algorithm.gdpo_reward_keys=[a] \
    trainer.default_local_dir="$TMP/gdpo-c" >"$TMP/gdpo-c.log" 2>&1
[ $? -ne 0 ] && says "$TMP/gdpo-c.log" "a C custom scorer returns one score"
expect "gdpo with a scorer of one score is refused when the run starts" $?
refused "must be one of grpo|grpo_vectorized" algorithm.adv_estimator=nonsense
expect "an unknown estimator lists the known ones" $?
refused "set algorithm.rollout_correction.bypass_mode=true" actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode
expect "loss_mode=bypass_mode is refused, naming bypass_mode" $?
refused "dro_beta must be a positive value" actor_rollout_ref.actor.policy_loss.loss_mode=dro
expect "dro without dro_beta is refused (verl's message)" $?
refused "leave loss_mode at vanilla" algorithm.rollout_correction.bypass_mode=true \
    actor_rollout_ref.actor.policy_loss.loss_mode=gspo
expect "bypass mode with another loss mode is refused" $?
refused "the update depends on the micro-batching" algorithm.rollout_correction.bypass_mode=true \
    algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_batch_normalize=true
expect "bypass mode with batch normalisation is refused with the reason" $?
refused "Invalid rollout_rs option 'geometric'" algorithm.rollout_correction.rollout_rs=geometric \
    algorithm.rollout_correction.rollout_rs_threshold=1.01
expect "verl v0.7's rollout_rs=geometric is refused, naming v0.9's seq_mean_k1" $?
refused "rollout_token_veto_threshold=1e-4: verl v0.7's catastrophic-token veto" \
    algorithm.rollout_correction.rollout_token_veto_threshold=1e-4
expect "verl v0.7's token veto is refused" $?
refused "Invalid rollout_is_threshold" algorithm.rollout_correction.rollout_is=token \
    algorithm.rollout_correction.rollout_is_threshold=high
expect "a malformed IS threshold is refused" $?
finish
