#!/usr/bin/env bash
# 2 colocated ranks (no rollout split: both generate and train) under grpod and mpirun:
#  - grpod, given none of the run's keys, follows the first rank's configuration and assigns both the hybrid
#    role; grpoctl workers shows them;
#  - grpoctl pause holds both at the next step boundary; grpoctl checkpoint while paused writes the checkpoint at
#    once (and is done on both ranks once resumed); the run ends with weights bit-identical to the same run
#    without grpod;
#  - grpoctl stop checkpoints and ends both cleanly; launched again, the run resumes to the same weights;
#  - a rank killed with SIGKILL (mpirun --mca orte_enable_recovery 1) ends the job within 10 s: grpod marks it
#    lost, tells the other to end and says so in grpoctl status; launched again, the run resumes from the newest
#    checkpoint to the same weights, bit for bit.
# usage: test_colocated_grpod.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../system/grpod_lib.sh"
test_env
tiny_model "$TMP/tiny"
expect "tiny model initialised" $?
STEPS=40
MPI_EXTRA=()
PLACE=(trainer.nnodes=1 trainer.n_gpus_per_node=2)
# run NAME [overrides...]: 2 colocated ranks, log in $TMP/NAME.log
run() {
    local name="$1"; shift
    mpirun --oversubscribe --bind-to none -np 2 "${MPI_EXTRA[@]}" "$WORKER" actor_rollout_ref.model.path="$TMP/tiny" \
        trainer.default_local_dir="$TMP/$name" trainer.project_name=p trainer.experiment_name=e \
        trainer.total_training_steps=$STEPS trainer.val_before_train=false trainer.test_freq=-1 \
        trainer.save_freq=1 trainer.max_actor_ckpt_to_keep=2 data.train_batch_size=4 \
        actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2 data.max_response_length=12 \
        actor_rollout_ref.actor.optim.lr=1e-3 data.synthetic.shots=0 data.synthetic.num_train=64 data.synthetic.num_val=4 \
        custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score "${PLACE[@]}" "$@" \
        >>"$TMP/$name.log" 2>&1
}
final() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor"; }

run ref
expect "reference run (no grpod) finishes" $?

# ---- pause, checkpoint, resume
start_grpod g1 # no run keys: the first rank's configuration defines the run
run paused grpod.endpoint="$EP" grpod.connect_timeout_s=20 &
MPI_PID=$!
track "$MPI_PID"
wait_for 60 step_at_least 3; expect "both ranks register and report steps" $?
"$GRPOCTL" workers >"$TMP/workers.txt" 2>&1
[ "$(grep -c ' hybrid ' "$TMP/workers.txt")" -eq 2 ]; expect "grpoctl workers: two hybrid ranks" $?
"$GRPOCTL" pause --wait="$(scaled 60)" >"$TMP/pause.out" 2>&1; expect "pause takes effect on both ranks" $?
s1="$(status_field .step)"
[ "$(status_field '[.workers[].state] | map(select(. == "paused")) | length')" = 2 ]
expect "both ranks report paused" $?
"$GRPOCTL" checkpoint --wait="$(scaled 60)" >"$TMP/ckpt.out" 2>&1 &
CKPT_PID=$!
wait_for 30 has "$TMP/paused.log" "checkpoint: step $s1 saved"
expect "grpoctl checkpoint while paused: the checkpoint of step $s1 is written at once" $?
s2="$(status_field .step)"
"$GRPOCTL" resume >/dev/null 2>&1; expect "resume" $?
wait "$CKPT_PID"; expect "... and every rank has it once resumed (grpoctl checkpoint --wait returns)" $?
[ "$(status_field .checkpoint_seq_done)" -ge 1 ] 2>/dev/null; expect "grpod counts the request written" $?
held_ranks() { has_lines "$TMP/paused.log" "control: resumed at step" 1; }
wait_for 60 held_ranks; expect "the ranks say they resumed" $?
paused_in_place "$TMP/paused.log" && [ "$s1" = "$s2" ]
expect "no step while paused: the ranks resumed at the step they paused at ($s1, $s2)" $?

wait "$MPI_PID"; expect "paused-and-resumed run finishes" $?
"$COMPARE" "$(final ref)" "$(final paused)" 0 >"$TMP/cmp1.txt" 2>&1
expect "pause + checkpoint + resume: weights bit-identical to the run without grpod" $?
stop_grpod

# ---- stop, then launch again
start_grpod g2 "${PLACE[@]}"
run stopped grpod.endpoint="$EP" grpod.connect_timeout_s=20 &
MPI_PID=$!
track "$MPI_PID"
wait_for 60 step_at_least 4; expect "second run under way" $?
"$GRPOCTL" stop --wait="$(scaled 60)" >"$TMP/stop.out" 2>&1; expect "stop" $?
wait "$MPI_PID"; expect "both ranks of the stopped run exit 0" $?
sstep="$(cat "$TMP/stopped/p/e/checkpoints/latest_checkpointed_iteration.txt" 2>/dev/null)"
[ -n "$sstep" ] && [ "$sstep" -lt $STEPS ]; expect "stop left a checkpoint mid-run (step $sstep)" $?
stop_grpod
run stopped
expect "launched again, the stopped run finishes" $?
"$COMPARE" "$(final ref)" "$(final stopped)" 0 >/dev/null 2>&1
expect "stop + resume: weights bit-identical to the run without a stop" $?

# ---- a rank killed: mpirun keeps the job (orte_enable_recovery), grpod tells the other rank to end
MPI_EXTRA=(--mca orte_enable_recovery 1)
start_grpod g3 "${PLACE[@]}"
run killed grpod.endpoint="$EP" grpod.connect_timeout_s=20 &
MPI_PID=$!
track "$MPI_PID"
wait_for 60 step_at_least 5; expect "third run under way" $?
victim="$("$GRPOCTL" status --json | jq -r '.workers[] | select(.rank == 1) | .pid')"
t0=$(date +%s%N)
kill -9 "$victim"; expect "colocated rank 1 (pid $victim) killed" $?
wait "$MPI_PID"
took=$(( ($(date +%s%N) - t0) / 1000000 ))
[ "$took" -lt 10000 ]; expect "the job ends within 10 s of the loss (${took} ms; heartbeat timeout 3 s)" $?
grep -q "colocated rank 1 on host .* lost .*: the other ranks are told to end" "$TMP/g3.log"
expect "grpod's journal says the colocated rank is lost and the other must end" $?
"$GRPOCTL" status >"$TMP/lost.txt" 2>&1
grep -q "colocated rank 1 on host .* lost.*relaunch the job" "$TMP/lost.txt"
expect "grpoctl status gives the reason and says to relaunch" $?
kstep="$(cat "$TMP/killed/p/e/checkpoints/latest_checkpointed_iteration.txt" 2>/dev/null)"
[ -n "$kstep" ] && [ "$kstep" -lt $STEPS ]; expect "a checkpoint before the loss (step $kstep)" $?
run killed grpod.endpoint="$EP" grpod.connect_timeout_s=20
expect "launched again under the same grpod, the run resumes and finishes" $?
grep -q "resumed from .*global_step_$kstep" "$TMP/killed.log"; expect "it resumed from the newest checkpoint" $?
"$COMPARE" "$(final ref)" "$(final killed)" 0 >/dev/null 2>&1; expect "kill + resume: weights bit-identical" $?
stop_grpod
finish
