#!/usr/bin/env bash
# Fully-async training (async_training.*, docs/training.md "Fully-async training") with rollout tensor parallelism:
# 1 trainer rank and 2 rollout ranks forming one rollout TP group (actor_rollout_ref.rollout.tensor_model_parallel_
# size=2, one engine: a work unit per chunk), on a tiny model under mpirun (3 ranks on 2 cores). The group's first
# rank hears the dispatcher and speaks for the group: it decides at each decode step whether a newer version stops
# the unit's phase (partial rollout), and the whole group stops at the same token, takes the version resharded and
# goes on; a replayed unit's schedule goes to every rank of the group.
#  - staleness_threshold 0 with trigger_parameter_sync_step 1 ends with weights bit-identical to the on-policy split
#    run with the same rollout TP group (rollout.mode=sync), with the same losses and scores step by step; the peer,
#    which sends no batch, starts no scorer;
#  - partial rollout with a slow engine (GRPO_TEST_DECODE_SLEEP_S), staleness 1: check_fully_async.py recomputes the
#    staleness and partial accounting in float64 from the audit files and the schedule, with trajectories continued
#    across versions; the replay of its schedule ends bit-identical, with the same schedule.
# usage: test_fully_async_tp.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/dist_lib.sh" grpo-fully-async-tp
# shellcheck disable=SC2034 # WHO: fully_async_lib.sh names the layout with it
WHO="rollout TP 2 "
. "$(dirname "$0")/fully_async_lib.sh" 1
COMMON+=(actor_rollout_ref.rollout.tensor_model_parallel_size=2)

# ---- on-policy equivalence: staleness 0, a push every step
onpolicy_pair
grep -q "fully-async training: 1 unit(s) of 4 group(s) a chunk" "$TMP/async0.log"
expect "one work unit a chunk: the TP group is one engine" $?
grep -q "TP rank 1 of 2 in rollout TP group 0 of 1" "$TMP/async0.log"
expect "the two rollout ranks form one TP group" $?
n_scorers=$(grep -c "reward: custom scorer byte_score" "$TMP/async0.log")
[ "$n_scorers" -eq 2 ]
expect "the scorer starts on the trainer and the group's first rank only, not on its peer, which sends no batch ($n_scorers)" $?
onpolicy_same actor/pg_loss actor/kl_loss actor/grad_norm critic/score/mean response_length/mean

# ---- partial rollout, a push every step, staleness 1; then its replay
LIVE=("${ASYNC[@]}" async_training.staleness_threshold=1 async_training.trigger_parameter_sync_step=1
    data.max_response_length=160 trainer.total_training_steps=6)
GRPO_TEST_DECODE_SLEEP_S=0.004 run partial "${LIVE[@]}"
expect "fully-async run with partial rollout on a rollout TP group (slow engine) finishes" $?
python3 "$CHECK" "$TMP/partial/p/e" "$TMP/partial/audit" 1 1 4 --partial >"$TMP/check1.txt" 2>&1
rc=$?; expect "float64 check, trajectories continued across versions on the TP group ($(tail -1 "$TMP/check1.txt"))" $rc
grep -Eq "policy version [0-9]+: .*resharded to 2 TP ranks" "$TMP/partial.log"
expect "each version is resharded to the group's 2 ranks" $?
replay_same partial 6 "${LIVE[@]}"
finish
