#!/usr/bin/env bash
# The real single-process trainer under grpod: it registers (hybrid role),
# heartbeats its step and metrics, and obeys grpoctl. A run paused mid-way
# and resumed ends with weights bit-identical to the same run alone; a run
# stopped mid-way checkpoints, and resumed later also ends bit-identical.
# Usage: test_trainer_grpod.sh (from the source root; the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/grpod_lib.sh"
export OPENBLAS_NUM_THREADS=1

tiny_model "$TMP/tiny"
expect "tiny model initialised" $?

# run NAME [overrides...]: the worker with a fixed small configuration, log in $TMP/NAME.log; enough steps that
# pause and stop arrive mid-run on a fast machine (a tiny step takes a few milliseconds)
STEPS=400
run() {
    local name="$1"; shift
    "$WORKER" actor_rollout_ref.model.path="$TMP/tiny" trainer.default_local_dir="$TMP/$name" \
        trainer.project_name=p trainer.experiment_name=e trainer.total_training_steps=$STEPS \
        trainer.val_before_train=false data.train_batch_size=2 actor_rollout_ref.rollout.n=4 \
        actor_rollout_ref.actor.ppo_mini_batch_size=2 data.max_response_length=12 \
        actor_rollout_ref.actor.optim.lr=1e-3 data.synthetic.shots=0 data.synthetic.num_train=64 data.synthetic.num_val=4 \
        "$@" >>"$TMP/$name.log" 2>&1
}
final_weights() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor/model.safetensors"; }

run ref
expect "reference run alone finishes" $?
[ -f "$(final_weights ref)" ]; expect "reference run wrote its final checkpoint" $?

# ---- pause mid-way, resume: identical result
start_grpod g
run paused grpod.endpoint="$EP" grpod.connect_timeout_s=20 &
WPID=$!
track "$WPID"
wait_for 60 step_at_least 2
expect "worker registered and reports its steps" $?
[ "$(status_field '.workers[0].role')" = hybrid ]; expect "single-process worker gets the hybrid role" $?
"$GRPOCTL" status >"$TMP/status.txt" 2>&1; expect "grpoctl status while training" $?
has "$TMP/status.txt" "hybrid"; expect "status table shows the worker's role" $?
"$GRPOCTL" pause --wait="$(scaled 60)" >"$TMP/pause.out" 2>&1; expect "pause takes effect at the next safe point" $?
s1="$(status_field .step)"
[ "$(status_field '.workers[0].state')" = paused ]; expect "worker reports paused" $?
"$GRPOCTL" metrics >"$TMP/metrics.out" 2>&1; expect "grpoctl metrics" $?
has "$TMP/metrics.out" "critic/score/mean"; expect "metrics carry verl's names" $?
"$GRPOCTL" resume >"$TMP/resume.out" 2>&1; expect "resume" $?
wait_for 30 has "$TMP/paused.log" "resumed at step"; expect "the worker says it resumed" $?
paused_in_place "$TMP/paused.log" && has "$TMP/paused.log" "resumed at step $s1"
expect "no step while paused: paused and resumed at step $s1" $?
wait "$WPID"; expect "paused-and-resumed run finishes (exit 0)" $?
cmp -s "$(final_weights ref)" "$(final_weights paused)"; expect "weights bit-identical to the uninterrupted run" $?
wait_for 10 state_is finished; expect "grpod reports the run finished" $?
stop_grpod

# ---- stop mid-way (checkpoint + clean exit), resume later: identical result
start_grpod g2
run stopped grpod.endpoint="$EP" grpod.connect_timeout_s=20 &
WPID=$!
track "$WPID"
wait_for 60 step_at_least 3
expect "second worker under way" $?
"$GRPOCTL" stop --wait="$(scaled 60)" >"$TMP/stop.out" 2>&1; expect "stop" $?
wait "$WPID"; expect "stopped worker exits 0" $?
sstep="$(cat "$TMP/stopped/p/e/checkpoints/latest_checkpointed_iteration.txt" 2>/dev/null)"
[ -n "$sstep" ] && [ "$sstep" -lt "$STEPS" ]; expect "stop wrote a checkpoint mid-run (step $sstep)" $?
has "$TMP/stopped.log" "stopped at step $sstep"; expect "worker log says where it stopped" $?
run stopped
expect "resumed run finishes" $?
cmp -s "$(final_weights ref)" "$(final_weights stopped)"; expect "stop + resume: weights bit-identical" $?

finish
