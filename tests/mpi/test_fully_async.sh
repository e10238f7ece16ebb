#!/usr/bin/env bash
# Fully-async training (async_training.*, docs/training.md "Fully-async training") on a tiny model under mpirun,
# 1 trainer + 2 rollout ranks (2 cores, oversubscribed):
#  - staleness_threshold 0 with trigger_parameter_sync_step 1 is on-policy: verl's data.train_batch_size=0 with
#    require_batches 2 ends with weights bit-identical to the on-policy split run's (rollout.mode=sync), whichever of
#    a step's units came first, and its metrics say staleness 0 throughout;
#  - partial rollout, with a slow engine (GRPO_TEST_DECODE_SLEEP_S) so that pushes come while units are generated
#    (staleness 1, a push every step): trajectories go on with newer weights, which the audit files' per-token
#    policy_versions show; check_fully_async.py recomputes from the audit files and the schedule, in float64, every
#    unit's staleness and drop decision, each trajectory's versions against its unit's schedule entry, and the
#    fully_async/ and training/off_policy/ metrics;
#  - the replay of that run's schedule (async_training.replay_schedule) ends with bit-identical weights and the
#    same schedule: deterministic given the same arrival order;
#  - rollout correction (token IS weights) on continued trajectories: tests/mpi/check_offpolicy.py recomputes every
#    token's weight from the audit's log-probs, each the version's that sampled it;
#  - a push every 2 steps, staleness 0.5: fully_async/count/current_param_version counts pushes; the same check;
#  - a unit held until version 3 is out (GRPO_TEST_HOLD_UNIT=1:v3), staleness 0.5: it comes 3 or more pushes stale, is
#    dropped and counted (fully_async/count/dropped_stale_samples), and the run goes on (one more is granted);
#  - a run ended at step 4 (its checkpoint drains the stream into async_state.bin) and launched again to step 8
#    resumes its stream (the units held, the next chunk); the replay of its schedule in one go ends bit-identical;
#  - refused by name at launch: a chunk that does not cut into a unit per rollout rank, no rollout ranks
#    (more trainer ranks: test_fully_async_dp.sh).
# usage: test_fully_async.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/dist_lib.sh" grpo-fully-async
# shellcheck disable=SC2034 # WHO: fully_async_lib.sh names the layout with it
WHO=""
. "$(dirname "$0")/fully_async_lib.sh" 1

# ---- on-policy equivalence: staleness 0, a push every step
onpolicy_pair
grep -q "fully-async training: 2 unit(s) of 2 group(s) a chunk" "$TMP/async0.log"
expect "data.train_batch_size=0 is require_batches x ppo_mini_batch_size, cut into a unit per rollout rank" $?
onpolicy_same actor/pg_loss actor/kl_loss actor/grad_norm critic/score/mean response_length/mean
python3 "$CHECK" "$TMP/async0/p/e" "$TMP/async0/audit" 1 0 4 >"$TMP/check0.txt" 2>&1
rc=$?; expect "float64 check of the on-policy stream ($(tail -1 "$TMP/check0.txt"))" $rc

# ---- partial rollout, a push every step, staleness 1; then its replay
LIVE=("${ASYNC[@]}" async_training.staleness_threshold=1 async_training.trigger_parameter_sync_step=1
    data.max_response_length=160 trainer.total_training_steps=8)
GRPO_TEST_DECODE_SLEEP_S=0.002 run partial "${LIVE[@]}"
expect "fully-async run with partial rollout (slow engine) finishes" $?
python3 "$CHECK" "$TMP/partial/p/e" "$TMP/partial/audit" 1 1 4 --partial >"$TMP/check1.txt" 2>&1
rc=$?; expect "float64 check, partial rollout seen ($(tail -1 "$TMP/check1.txt"))" $rc
python3 - "$TMP/partial/p/e/metrics.jsonl" <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert sum(x["fully_async/partial/total_partial_num"] for x in m) > 0
for key in ("fully_async/trainer/idle_ratio", "fully_async/rollouter/idle_ratio", "fully_async/partial/partial_ratio"):
    assert all(0 <= x[key] <= 1 for x in m), key
assert all(x["fully_async/static/max_required_samples"] == 8 for x in m)  # (1 + 1) x 4 x 1
print("partial trajectories counted; idle ratios in [0, 1]")
PY
expect "fully_async/partial/* count the continued trajectories; verl's static figures" $?
replay_same partial 8 "${LIVE[@]}"

# ---- rollout correction on continued trajectories: each token's IS weight from its own sampler's log-prob
CORR=(algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=2.0)
GRPO_TEST_DECODE_SLEEP_S=0.002 run corr "${ASYNC[@]}" async_training.staleness_threshold=1 \
    async_training.trigger_parameter_sync_step=1 data.max_response_length=160 trainer.total_training_steps=4 "${CORR[@]}"
expect "fully-async run with partial rollout and rollout correction finishes" $?
python3 "$CHECK" "$TMP/corr/p/e" "$TMP/corr/audit" 1 1 4 --partial >"$TMP/checkc.txt" 2>&1 &&
    python3 "$(dirname "$0")/check_offpolicy.py" "$TMP/corr/p/e" "$TMP/corr/audit" 4 data.max_response_length=160 \
        "${CORR[@]}" check_pg_loss=0 >"$TMP/checkc2.txt" 2>&1
rc=$?; expect "mixed versions in the step, and the IS weights and rollout_corr/ metrics agree with the float64 recomputation ($(tail -1 "$TMP/checkc2.txt"))" $rc

# ---- a push every 2 steps, staleness 0.5
GRPO_TEST_DECODE_SLEEP_S=0.002 run trig2 "${ASYNC[@]}" async_training.staleness_threshold=0.5 \
    async_training.trigger_parameter_sync_step=2 data.max_response_length=160 trainer.total_training_steps=8
expect "fully-async run, a push every 2 steps, finishes" $?
python3 "$CHECK" "$TMP/trig2/p/e" "$TMP/trig2/audit" 2 0.5 4 >"$TMP/check2.txt" 2>&1
rc=$?; expect "float64 check with trigger 2 ($(tail -1 "$TMP/check2.txt"))" $rc

# ---- a unit that comes too stale is dropped and counted
GRPO_TEST_HOLD_UNIT=1:v3 run drop "${ASYNC[@]}" async_training.staleness_threshold=0.5 \
    async_training.trigger_parameter_sync_step=1 async_training.partial_rollout=false trainer.total_training_steps=12
expect "fully-async run with a unit held until version 3 finishes" $?
# (which chunk the rank's first unit is depends on who asked first: the rank says which one it holds)
held="$(grep -Eo "holding chunk [0-9]+ unit [01]" "$TMP/drop.log" | head -n 1 | sed 's/^holding //')"
said="$(grep -Eo "${held:-none} dropped: [0-9]+ pushes stale \(at most 1\)" "$TMP/drop.log")"
st="$(echo "$said" | grep -Eo "[0-9]+ pushes" | grep -Eo "[0-9]+")"
[ -n "$st" ] && [ "$st" -ge 3 ]
expect "the held unit ($held) is dropped: $st pushes stale (at least 3: held until version 3), at most ceil(0.5) = 1" $?
python3 "$CHECK" "$TMP/drop/p/e" "$TMP/drop/audit" 1 0.5 4 --dropped >"$TMP/check3.txt" 2>&1
rc=$?; expect "float64 check of the drop accounting ($(tail -1 "$TMP/check3.txt"))" $rc

# ---- a run ended at step 4 and launched again to step 8 resumes its stream; the replay in one go agrees
resume_same

# ---- refused by name at launch
! timeout 120 "${MPIRUN[@]}" -np 4 "$WORKER" "${COMMON[@]}" "${ASYNC[@]}" placement.rollout_ranks=3 \
    trainer.default_local_dir="$TMP/three" >"$TMP/three.log" 2>&1 &&
    says "$TMP/three.log" "fully-async training (async_training.*) with a stream chunk (data.train_batch_size prompts) that does not cut into one equal work unit per rollout rank"
expect "4 prompts a chunk over 3 rollout ranks: refused by name" $?
! timeout 120 "$WORKER" actor_rollout_ref.model.path="$TMP/tiny" "${ASYNC[@]}" \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 trainer.default_local_dir="$TMP/one" >"$TMP/one.log" 2>&1 &&
    says "$TMP/one.log" "needs separate rollout ranks"
expect "no rollout ranks: refused by name" $?
finish
