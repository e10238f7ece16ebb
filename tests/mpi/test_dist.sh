#!/usr/bin/env bash
# Distributed runs on a tiny model under mpirun (2 cores, oversubscribed):
#  - 1 rollout + 2 trainer ranks, on-policy, reproduce the single-process run: per-step losses and grad norms,
#    and the final weights, within 1e-5 relative; the audit files hold every uid exactly rollout.n times a step;
#  - the same run with a stranger writing garbage to a trainer's data socket (without credentials: refused before
#    anything else is looked at), then well-formed, authenticated batches for steps 1,000,000 on, a response of
#    zero tokens, and batches that would take the place of step 1's real one (a prompt not of its place in the
#    step, an out-of-range policy_version, forged rewards naming a rank the unit was not granted to), on DP rank 0
#    (the dispatcher's) and DP rank 1: every bad message is refused (the answer says why) and counted by reason,
#    none is trained on, and the result is bit-identical to the undisturbed run;
#  - one-step-off (rollout.mode=async, 1 rollout + 1 trainer): staleness 1 logged, the rollout-vs-trainer
#    log-prob gap measured, the run finishes;
#  - impossible placements are errors that name the keys and the numbers, before any work starts.
# usage: test_dist.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/dist_lib.sh" grpo-dist
STRANGER="$(prog data-stranger)"
STEPS=4
COMMON=(actor_rollout_ref.model.path="$TMP/tiny" trainer.project_name=p trainer.experiment_name=e
    trainer.total_training_steps=$STEPS trainer.val_before_train=false trainer.test_freq=-1
    data.train_batch_size=4 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2
    data.max_response_length=12 actor_rollout_ref.actor.optim.lr=1e-3 data.synthetic.shots=0 data.synthetic.num_train=64
    data.synthetic.num_val=4 actor_rollout_ref.rollout.update_weights_bucket_megabytes=1
    actor_rollout_ref.actor.use_kl_loss=true
    custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score)
weights() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor"; }

"$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/one" trainer.rollout_data_dir="$TMP/one/audit" \
    >"$TMP/one.log" 2>&1
expect "single-process run finishes" $?

timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/split" \
    trainer.rollout_data_dir="$TMP/split/audit" placement.trainer_ranks=2 placement.rollout_ranks=1 \
    trainer.log_level=debug >"$TMP/split.log" 2>&1
expect "1 rollout + 2 trainer ranks finish" $?
grep -q "rank 2 of 3: rollout" "$TMP/split.log"; expect "rank 2 takes the rollout role" $?
grep -q "rank 1 of 3: trainer, dp 1 of 2" "$TMP/split.log"; expect "rank 1 is trainer DP rank 1" $?
grep -q "weights identical on 2 DP ranks" "$TMP/split.log"; expect "replica checksums compared every step" $?
! grep -q "weights differ" "$TMP/split.log"; expect "replicas never differ" $?
grep -q "policy version 1: [0-9]* bytes in [0-9]* chunk" "$TMP/split.log"; expect "weight sync is logged with bytes and chunks" $?

python3 - "$TMP/one/p/e/metrics.jsonl" "$TMP/split/p/e/metrics.jsonl" <<'PY'
import json, sys
one = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
two = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
assert len(one) == len(two) == 4, (len(one), len(two))
worst = 0
for a, b in zip(one, two):
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean",
              "response_length/mean", "critic/advantages/max", "perf/total_num_tokens"):
        x, y = a[k], b[k]
        # the losses are means of terms of size about |advantage| ~ 1 that cancel to 1e-3 or less: their rounding
        # is relative to the terms, so small values are compared against 1e-2
        rel = abs(x - y) / max(abs(x), 1e-2)
        worst = max(worst, rel)
        if rel > 1e-5:
            sys.exit(f"step {a['step']} {k}: single process {x}, split {y} (relative {rel:.2e})")
for b in two[1:]:
    assert b["training/staleness"] == 0 and b["timing_s/update_weights"] > 0 and b["perf/update_weights_bytes"] > 0, b
    assert 0 <= b["trainer/idle_ratio"] <= 1 and 0 <= b["rollouter/idle_ratio"] <= 1, b
    # on-policy, the rollout rank waits for the weights of the step before each step, and that is measured
    assert b["timing_s/rollout_wait_weights"] > 0 and b["timing_s/rollout_wait_send"] >= 0, b
print(f"per-step metrics agree: worst relative difference {worst:.2e}")
PY
expect "per-step losses and grad norms match the single-process run within 1e-5" $?
"$COMPARE" "$(weights one)" "$(weights split)" 1e-5 >"$TMP/cmp.txt" 2>&1
rc=$?
expect "final weights match the single-process run within 1e-5 ($(cat "$TMP/cmp.txt"))" $rc

# overlap_grad_reduce (on by default): the layers' buckets summed during the backward give the sums of one
# all-reduce after it, bit for bit (2 DP ranks: each element is a + b either way)
for v in off:overlap_grad_reduce=false buckets:bucket_size=20000; do
    timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/${v%%:*}" \
        placement.trainer_ranks=2 placement.rollout_ranks=1 \
        +actor_rollout_ref.actor.megatron.override_ddp_config.${v#*:} >"$TMP/${v%%:*}.log" 2>&1
    expect "split run with override_ddp_config.${v#*:} finishes" $?
done
grep -q "DP gradients all-reduced in 1 bucket(s)" "$TMP/split.log"
expect "the default bucket holds the tiny model's layers in one" $?
grep -Eq "DP gradients all-reduced in 2 bucket\(s\) of up to [0-9]+ parameters" "$TMP/buckets.log"
rc=$?
expect "bucket_size=20000 gives each of the 2 layers its own: $(grep -o 'in [0-9]* bucket(s) of up to [0-9]*' "$TMP/buckets.log")" $rc
! grep -q "DP gradients all-reduced in" "$TMP/off.log"
expect "overlap_grad_reduce=false: one all-reduce after the backward" $?
"$COMPARE" "$(weights off)" "$(weights split)" 0 >/dev/null 2>&1
expect "overlapped (one bucket) and not: bit-identical weights" $?
"$COMPARE" "$(weights off)" "$(weights buckets)" 0 >"$TMP/cmpb.txt" 2>&1
rc=$?
expect "several buckets and none: bit-identical weights ($(cat "$TMP/cmpb.txt"))" $rc

# ZeRO-1 over the 2 trainer DP ranks: the same update, with each rank holding half of the optimizer state
timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/zero" \
    placement.trainer_ranks=2 placement.rollout_ranks=1 trainer.save_freq=2 \
    actor_rollout_ref.actor.megatron.use_distributed_optimizer=true >"$TMP/zero.log" 2>&1
expect "ZeRO-1 run (1 rollout + 2 trainer ranks) finishes" $?
grep -q "ZeRO-1: DP rank 1 keeps the optimizer state of parameters 45312..90624" "$TMP/zero.log"
expect "ZeRO-1: each DP rank keeps its half of the optimizer state" $?
"$COMPARE" "$(weights split)" "$(weights zero)" 1e-6 >"$TMP/cmpz.txt" 2>&1
rc=$?
expect "ZeRO-1 weights match the all-reduce run within 1e-6 ($(cat "$TMP/cmpz.txt"))" $rc
"$COMPARE" "$(weights one)" "$(weights zero)" 1e-5 >/dev/null 2>&1
expect "ZeRO-1 weights match the single-process run within 1e-5" $?
python3 - "$TMP/split/p/e/metrics.jsonl" "$TMP/zero/p/e/metrics.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
b = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    assert abs(x["actor/grad_norm"] - y["actor/grad_norm"]) <= 1e-6 * abs(x["actor/grad_norm"]), (x, y)
    # the optimizer state per rank: two FP32 moments of every parameter, or of half of them
    assert abs(x["perf/optimizer_state_gb"] - 8 * 90624 / 1e9) < 1e-12, x["perf/optimizer_state_gb"]
    assert abs(y["perf/optimizer_state_gb"] - 8 * 45312 / 1e9) < 1e-12, y["perf/optimizer_state_gb"]
print("grad norms agree, optimizer state halved")
PY
expect "ZeRO-1: grad norms match the all-reduce run, optimizer state per rank is 1/DP" $?
# the planner's DP bytes per step for these layouts against what the collective plane counted in the two runs
"$MODEL_TOOL" plan "$TMP/tiny" --cpu --nodes 1 --gpus-per-node 2 --prompts 4 --n 4 --mini-batches 2 --all --bytes \
    >"$TMP/plan.txt" 2>&1
python3 - "$TMP/plan.txt" "$TMP/split/p/e/metrics.jsonl" "$TMP/zero/p/e/metrics.jsonl" <<'PY'
import json, re, sys
plan = open(sys.argv[1]).read()
def predicted(zero):
    m = re.search(rf"bytes tp=1 pp=1 dp=2 zero1={zero}: tp \d+ pp \d+ dp (\d+)", plan)
    assert m, plan
    return float(m.group(1))
for path, zero in ((sys.argv[2], 0), (sys.argv[3], 1)):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    for r in rows:
        assert r["perf/comm_bytes/dp"] == predicted(zero), (path, r["step"], r["perf/comm_bytes/dp"], predicted(zero))
print("DP bytes per step: planned", predicted(0), "=", "measured")
PY
expect "the planner's DP bytes per step equal the measured ones (all-reduce and ZeRO-1)" $?
# checkpoints stay whole: the ZeRO-1 run's step-2 checkpoint resumed by one process (DP 1, no ZeRO)
mkdir -p "$TMP/relayout/p/e/checkpoints"
cp -r "$TMP/zero/p/e/checkpoints/global_step_2" "$TMP/relayout/p/e/checkpoints/"
echo 2 >"$TMP/relayout/p/e/checkpoints/latest_checkpointed_iteration.txt"
"$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/relayout" >"$TMP/relayout.log" 2>&1
expect "a ZeRO-1 checkpoint (DP 2) resumes in one process" $?
grep -q "resumed from .*global_step_2" "$TMP/relayout.log"; expect "it resumed from step 2" $?
"$COMPARE" "$(weights one)" "$(weights relayout)" 1e-5 >/dev/null 2>&1
expect "change of layout on resume (ZeRO-1 DP 2 -> one process): weights match within 1e-5" $?

python3 "$(dirname "$0")/check_audit.py" "$TMP/split/audit" 4 4 "$STEPS"
expect "audit files: every prompt's group exactly once per step" $?
python3 "$(dirname "$0")/check_audit.py" "$TMP/one/audit" 4 4 "$STEPS"
expect "one process's audit files: likewise, and a uid is the dataset's" $?

# strangers on trainer DP rank 0's data socket while the run goes on (the rollout rank's scorer holds each
# sample, with the same rewards, until they are done: the trainer waits for step 1 meanwhile)
touch "$TMP/hold"
"${MPIRUN[@]}" -x GRPO_TEST_HOLD_FILE="$TMP/hold" -x GRPO_TEST_SPARE_CREDENTIALS="$TMP/spare.cred" -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/noisy" \
    placement.trainer_ranks=2 placement.rollout_ranks=1 grpod.data_endpoint="ipc://$TMP/data" \
    custom_reward_function.name=held_byte_score >"$TMP/noisy.log" 2>&1 &
RUN=$!
wait_for 10 test -S "$TMP/data-dp0.sock"; expect "trainer DP rank 0's data socket appears" $?
"$STRANGER" "ipc://$TMP/data-dp0.sock" >"$TMP/stranger.log" 2>&1
expect "each of the stranger's messages is answered with a refusal" $?
grep -q "unknown prompt: the message carries no authentication" "$TMP/stranger.log"
rc=$?
expect "a refusal says what was wrong ($(sed -n 3p "$TMP/stranger.log"))" $rc
# a stranger who knows the run and holds one rollout process's key (GRPO_TEST_SPARE_CREDENTIALS): well-formed,
# authenticated batches for far steps, a response of zero tokens, and batches that would take step 1's place
"$STRANGER" "ipc://$TMP/data-dp0.sock" 0 --cred "$TMP/spare.cred" "${COMMON[@]}" placement.trainer_ranks=2 placement.rollout_ranks=1 \
    >"$TMP/stranger2.log" 2>&1
rc=$?
expect "far steps and a zero-token response are refused ($(grep -v "info  data" "$TMP/stranger2.log" | tr '\n' ';'))" $rc
grep -q "step 1000000: batch for step 1000000, but the trainers take steps" "$TMP/stranger2.log"
expect "the refusal of a far step says which steps are taken" $?
grep -q "zero tokens: sequence 0: an empty response (0 tokens)" "$TMP/stranger2.log"
expect "the refusal of a zero-token response says so" $?
grep -q "not of its place in this step: step 1 unit 0 from rank 2: group 0 holds prompt uid" "$TMP/stranger2.log"
expect "a batch holding a prompt not of its place in the step is refused, naming both prompts" $?
grep -q "out-of-range policy_version: policy_version 7 for step 1" "$TMP/stranger2.log"
expect "a batch with an out-of-range field is refused, naming it" $?
grep -q "not granted the unit: from_rank 1, but the batch is authenticated as rank 2's: no process speaks for another" \
    "$TMP/stranger2.log"
expect "forged rewards naming a rank not granted the unit are refused: the key speaks for its own rank only" $?
# the same on DP rank 1, which has no dispatcher (it refuses a unit from a rank that is no rollout rank's sender;
# one from a rollout rank it keeps until DP rank 0 says whose copy counts)
"$STRANGER" "ipc://$TMP/data-dp1.sock" 1 --cred "$TMP/spare.cred" "${COMMON[@]}" placement.trainer_ranks=2 placement.rollout_ranks=1 \
    >"$TMP/stranger3.log" 2>&1
chk=$?; expect "DP rank 1: each of the stranger's batches is refused ($(tr '\n' ';' <"$TMP/stranger3.log"))" $chk
rm -f "$TMP/hold"
wait $RUN
expect "the run with a stranger on the data socket finishes" $?
grep -q "refused a batch on the data socket" "$TMP/noisy.log"; expect "bad messages are refused with a reason" $?
grep -Eq "DP rank 0: 29 batch\(es\) refused" "$TMP/noisy.log"; expect "each bad message is counted" $?
grep -q "DP rank 1: 24 batch(es) refused, .* 3 malformed or out of range, 20 for a later step, 0 not granted to their sender, 1 with other" \
    "$TMP/noisy.log"
expect "DP rank 1 refuses the forged copy (counted with the malformed: its MAC speaks for another rank)" $?
grep -q "a forged reward for a real prompt from a rank not granted the unit: from_rank 1, but the batch is authenticated as rank 2's" \
    "$TMP/stranger3.log"
expect "DP rank 1's refusal says the batch names another rank than its key's" $?
python3 - "$TMP/noisy/p/e/metrics.jsonl" <<'PY'
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
got = {k: last.get("dataplane/" + k) for k in
       ("dropped_batches", "dropped/invalid", "dropped/future_step", "dropped/not_granted", "dropped/other_prompts")}
want = {"dropped_batches": 29, "dropped/invalid": 8, "dropped/future_step": 20, "dropped/not_granted": 0,
        "dropped/other_prompts": 1}
assert got == want, got
print("dropped batches counted by reason:", got)
PY
expect "the metrics count each dropped batch by its reason" $?
"$COMPARE" "$(weights split)" "$(weights noisy)" 0 >/dev/null 2>&1
expect "the stranger changed nothing (weights bit-identical to the undisturbed run)" $?

# one-step-off
timeout "$(scaled 300)" "${MPIRUN[@]}" -np 2 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/async" \
    placement.trainer_ranks=1 placement.rollout_ranks=1 actor_rollout_ref.rollout.mode=async >"$TMP/async.log" 2>&1
expect "one-step-off run finishes" $?
python3 - "$TMP/async/p/e/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert [r["training/staleness"] for r in rows] == [0, 1, 1, 1], [r["training/staleness"] for r in rows]
assert rows[0]["training/rollout_probs_diff_mean"] < 1e-4, rows[0]
assert all(r["training/rollout_probs_diff_mean"] > 1e-4 for r in rows[1:]), rows
print("staleness and the rollout-vs-trainer gap are logged")
PY
expect "one-step-off: staleness 1 after the first step, and the log-prob gap measured" $?

# placements that cannot work
"${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/bad" placement.trainer_ranks=2 \
    placement.rollout_ranks=2 >"$TMP/bad1.log" 2>&1
[ $? -ne 0 ] && grep -q "placement.trainer_ranks 2 + placement.rollout_ranks 2 = 4, but mpirun started 3" "$TMP/bad1.log"
expect "ranks that do not add up are refused, naming the keys" $?
"${MPIRUN[@]}" -np 2 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/bad" rollout.nnodes=1 \
    rollout.n_gpus_per_node=2 >"$TMP/bad2.log" 2>&1
[ $? -ne 0 ] && grep -q "no trainers" "$TMP/bad2.log"; expect "a placement without trainers is refused" $?
"${MPIRUN[@]}" -np 6 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/bad" placement.trainer_ranks=1 \
    placement.rollout_ranks=5 >"$TMP/bad3.log" 2>&1
[ $? -ne 0 ] && grep -q "more than the 4 prompts of a step" "$TMP/bad3.log"
expect "more rollout ranks than prompts is refused" $?
"${MPIRUN[@]}" -np 6 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/bad" >"$TMP/bad4.log" 2>&1
[ $? -ne 0 ] && grep -q "6 colocated ranks in 6 generation group(s) .*more groups than the 4 prompts" "$TMP/bad4.log"
expect "more colocated generation groups than prompts are refused" $?
"${MPIRUN[@]}" -np 3 --mca orte_enable_recovery 1 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/bad" \
    placement.trainer_ranks=2 placement.rollout_ranks=1 >"$TMP/bad5.log" 2>&1
[ $? -ne 0 ] && grep -q "without grpod nobody would tell the trainers" "$TMP/bad5.log"
expect "mpirun's recovery mode without grpod is refused, and the whole job ends" $?
[ ! -d "$TMP/bad" ]; expect "no refused placement started any work" $?

finish "$TMP"/split.log "$TMP"/noisy.log "$TMP"/async.log
