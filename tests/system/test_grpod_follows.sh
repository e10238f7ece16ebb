#!/usr/bin/env bash
# grpod follows the run (issue 25, item 5): grpod started with none of the run's keys; a split run of 2 trainer
# + 1 rollout ranks (tiny model) registers, the first rank's configuration lays the run out, and it trains. A
# process given other values of the run's keys is refused, naming them. The rollout rank is killed, and
# grpo-worker --replace-rank 2 given only grpod.endpoint takes the run's configuration from grpod, takes the
# place (asking a grpod restarted on its journal in between) and logs as rank 2, and the run finishes. A
# replacement for a rank the run does not have (7) is refused with the reason on its own log (issue 26).
# usage: test_grpod_follows.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/grpod_lib.sh"
. "$(dirname "$0")/tiny_split.sh"
tiny_split "$TMP"
expect "tiny model and split run configuration" $?
STEPS=30
start_grpod g1 grpod.heartbeat_interval_s=0.5
expect "grpod starts with no run keys" $?
grep -q "the first rank's configuration defines the run" "$TMP/g1.log"; expect "grpod says the first rank defines the run" $?
# each update sleeps 0.5 s (test.delay_phase): the tiny run's 30 steps take 15 s or more, so it is still running
# when rank 2 is killed below (unslowed, the steps take 0.05 s and the run could end before the kill)
mpirun --oversubscribe --bind-to none -np 3 --mca orte_enable_recovery 1 "$WORKER" --config "$TMP/split.yaml" \
    trainer.n_gpus_per_node=2 trainer.total_training_steps=$STEPS test.delay_phase=update_actor test.delay_s=0.5 \
    grpod.endpoint="$EP" >"$TMP/run.log" 2>&1 &
MPI_PID=$!
track "$MPI_PID"
wait_for 90 step_at_least 2; expect "2 trainer + 1 rollout ranks register and train" $?
[ "$(status_field '[.workers[].role] | join(",")')" = "trainer,trainer,rollout" ]
expect "grpod laid the run out from its first rank's configuration: trainer,trainer,rollout" $?
grep -q "follows rank [0-9]'s configuration: 2 trainer + 1 rollout ranks" "$TMP/g1.log"
expect "grpod's log says whose configuration the run follows" $?

# a replacement given a key of the run with another value is refused, naming the key and both values
"$WORKER" --replace-rank 2 grpod.endpoint="$EP" actor_rollout_ref.rollout.n=4 >"$TMP/wrong.log" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "actor_rollout_ref.rollout.n (given here: 4, run: 2)" "$TMP/wrong.log"
chk=$?; expect "a replacement with another rollout.n is refused naming it (exit $rc: $(grep -o 'differ.*' "$TMP/wrong.log" | head -1))" $chk

# a rank the run does not have: refused with the reason on the process itself (it is alone: nobody else says it)
"$WORKER" --replace-rank 7 grpod.endpoint="$EP" >"$TMP/rank7.log" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "error .*--replace-rank 7: .*rank 7" "$TMP/rank7.log"
chk=$?; expect "--replace-rank 7 of a 3-rank run exits 2 saying why (exit $rc: $(grep -o 'replace-rank 7:.*' "$TMP/rank7.log"))" $chk

victim="$(status_field '.workers[] | select(.rank == 2) | .pid')"
at="$(status_field .step)"
kill -9 "$victim" && [ "${at:-$STEPS}" -lt "$STEPS" ]
expect "rollout rank 2 (pid $victim) killed while the run trains, at step $at of $STEPS" $?
rank2_lost() { [ "$(status_field '.workers[] | select(.rank == 2) | .state')" = lost ]; }
wait_for 20 rank2_lost; expect "grpod marks it lost" $?
# grpod restarted on its journal: the run's configuration survives it (the replacement below asks this one)
stop_grpod; expect "grpod stopped" $?
start_grpod g1 grpod.heartbeat_interval_s=0.5; expect "grpod restarted on its journal" $?
# only the endpoint: the rest of the configuration comes from grpod
OPENBLAS_NUM_THREADS=1 "$WORKER" --replace-rank 2 grpod.endpoint="$EP" >"$TMP/replace.log" 2>&1 &
REPL_PID=$!
track "$REPL_PID"
wait "$MPI_PID"; rc=$?
# Open MPI 4.1 sometimes waits in MPI_Finalize for the lost rank: the ranks end by themselves after 20 s
[ "$rc" -eq 0 ] || { grep -q "MPI_Finalize has not returned" "$TMP/run.log" && state_is finished; }
expect "the job finishes (mpirun exit $rc)" $?
wait "$REPL_PID"; expect "the replacement finishes with it" $?
grep -q "took run .*'s configuration from grpod" "$TMP/replace.log"
expect "the replacement took the run's configuration from grpod" $?
grep -q "registered with grpod .*role rollout" "$TMP/replace.log"; expect "and registered as the rollout rank" $?
grep -q '\[rank 2\] rollout: ' "$TMP/replace.log" && ! grep -q '\[rank [013-9]' "$TMP/replace.log"
expect "the replacement logs as rank 2, the rank it replaces" $?
grep -Eq "finished: .*\(([1-9][0-9]*) unit\(s\) generated here\)" "$TMP/replace.log"
rc=$?; expect "it generated the rest of the run ($(grep -o '([0-9]* unit(s) generated here)' "$TMP/replace.log"))" $rc
state_is finished && [ "$(status_field .step)" = "$STEPS" ]
chk=$?; expect "the run finished all $STEPS steps ($(status_field .state), step $(status_field .step))" $chk
[ -f "$TMP/runs/p/e/checkpoints/global_step_$STEPS/actor/model.safetensors" ]
expect "the trainer wrote the final checkpoint" $?
finish
