#!/usr/bin/env bash
# grpod given the run's keys places SP ranks as the workers do (issue 40, item 3): a split run of 2 trainer ranks
# (Ulysses SP 2, so one DP rank) + 1 rollout rank, tiny model; grpod started with the same configuration and keys
# as the ranks assigns each the role and DP coordinates it computes itself (trainer dp 0/1 twice, rollout dp 0/1),
# every rank registers and the run finishes. Before, grpod dropped the SP size and assigned dp 0/2, and every rank
# refused its assignment.
# usage: test_grpod_keyed_sp.sh GRPOD GRPOCTL SIM_WORKER GRPO_WORKER GRPO_MODEL
set -u
. "$(dirname "$0")/grpod_lib.sh" "$1" "$2" "$3"
WORKER="$4" MODEL_TOOL="$5"
. "$(dirname "$0")/tiny_split.sh"
tiny_split "$TMP"
expect "tiny model and split run configuration" $?
KEYS=(trainer.n_gpus_per_node=2 actor_rollout_ref.actor.ulysses_sequence_parallel_size=2)
start_grpod g1 --config "$TMP/split.yaml" "${KEYS[@]}"
expect "grpod starts with the run's configuration and keys (SP 2)" $?
grep -q "checking every rank against grpod's own keys, placement included" "$TMP/g1.log"
expect "grpod lays the run out from its own keys" $?
mpirun --oversubscribe --bind-to none -np 3 "$WORKER" --config "$TMP/split.yaml" "${KEYS[@]}" \
    grpod.endpoint="$EP" >"$TMP/run.log" 2>&1
rc=$?
expect "the job finishes (mpirun exit $rc: $(grep -o 'grpod assigned.*' "$TMP/run.log" | head -1))" $rc
[ "$(grep -c 'registered with grpod at .*role trainer, dp 0/1' "$TMP/run.log")" -eq 2 ] &&
    [ "$(grep -c 'registered with grpod at .*role rollout, dp 0/1' "$TMP/run.log")" -eq 1 ]
expect "grpod assigned both SP ranks trainer dp 0/1 and the rollout rank rollout dp 0/1" $?
! grep -q "grpod assigned role" "$TMP/run.log"; expect "no rank refused its assignment" $?
roles="$(status_field '[.workers[].role] | join(",")')"
[ "$roles" = "trainer,trainer,rollout" ]; expect "grpod's workers: trainer,trainer,rollout ($roles)" $?
state="$(status_field .state)" step="$(status_field .step)"
[ "$state" = finished ] && [ "$step" = 3 ]; expect "the run finished its 3 steps ($state, step $step)" $?
finish
