#!/usr/bin/env bash
# Trainer-loss survival (trainer.survive_trainer_loss) of the lead, rank 0 (it decides, logs, checkpoints and writes
# the audit files for every rank): 3 colocated plain-DP ranks of this build (against Open MPI 5) under
# scripts/mpirun_ft, a checkpoint every 2 steps; rank 0 held at its point by GRPO_TEST_KILL_AT (worker/survive/
# survive.h: a hold the test waits on, not a sleep) and SIGKILLed there:
#  (a) with step 3's generation done (gen:3:0);
#  (b) in step 2's gradient all-reduce, its buckets started (allreduce:2:0);
#  (c) in the middle of step 4's checkpoint, its weights and optimizer state written and not yet moved into place
#      (ckpt:4:0; the survivors find the loss in step 5): while the new lead (launch rank 1) writes step 4's
#      checkpoint again (held there: ckpt:5:1), the directory holds step 4 only as .global_step_4.tmp and
#      latest_checkpointed_iteration.txt names step 2 (no half checkpoint a relaunch would take); then the run
#      finishes with step 4's checkpoint in place and equal to one process's;
#  (d) under grpod, with step 3's generation done (gen:3:0), the new lead then held at step 5's generation (gen:5:1,
#      not killed): the new lead holds run.lock, grpod shows rank 0 lost with the reason, the run running, ranks 1
#      and 2 running; released, the run finishes and grpod says so.
# Each: the run finishes (mpirun exits 0), launch rank 1 says it leads from the redone step, the weights equal one
# process's within 1e-5 relative (every DP layout reproduces it, so the survivors' DP 2 from the redone step on
# does too), the audit files hold every group of every step exactly rollout.n times, metrics.jsonl holds each step
# once (the redone step's line once), and the checkpoints of steps 2 and 4 equal one process's.
# Skipped (77) without Open MPI 5 (scripts/ompi5_env.sh --no-install).
set -u
. "$(dirname "$0")/../lib.sh" grpo-ft-lead
SAVE_FREQ=2 # read by survive_lib.sh
# shellcheck source=tests/ft/survive_lib.sh
. "$(dirname "$0")/survive_lib.sh"
survive_start
# shellcheck disable=SC2034 # start_grpod (tests/lib.sh) runs $GRPOD
GRPOD="$(prog grpod)" GRPOCTL="$(prog grpoctl)"

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 1 grpo-worker $(keys one) >"$TMP/one.log" 2>&1
expect "one process: $STEPS steps" $?
metrics_once one

# the checks of a run whose lead was lost in step FOUND
lead_survived() {
    local name="$1" found="$2" out k
    survived "$name" "$found" 0 2
    says "$TMP/$name.log" "the lead (rank 0) lost: rank 1 leads from step $found"
    expect "$name: launch rank 1 says it leads from step $found" $?
    has "$TMP/$name.log" "[rank 1] worker: run finished at step $STEPS"
    expect "$name: the new lead logs the run's end" $?
    same_as_one "$name"
    metrics_once "$name"
    checkpoints_as_one "$name"
}

# killed POINT STEP FOUND: rank 0 held at POINT of step STEP and SIGKILLed there; its loss found in step FOUND
killed() {
    local name="lead-$1-$2"
    start_held "$name" 3 "$1:$2:0"
    kill_held "$name" "rank 0 at $1 of step $2"
    wait "$JOB"
    expect "$name: the run finishes without rank 0 (mpirun exits 0)" $?
    lead_survived "$name" "$3"
}
killed gen 3 3
killed allreduce 2 2

# (c) the lead in the middle of writing step 4's checkpoint; the new lead held in writing it again
name=lead-ckpt
ck="$TMP/$name/p/e/checkpoints"
start_held "$name" 3 ckpt:4:0,ckpt:5:1
kill_held "$name" "rank 0 in the middle of step 4's checkpoint"
wait_for 60 held_or_ended
newlead="$(cat "$HOLD.held" 2>/dev/null)"
[ -n "$newlead" ]
expect "$name: the new lead holds in writing step 4's checkpoint again (pid ${newlead:-none})" $?
[ -d "$ck/.global_step_4.tmp" ] && [ -f "$ck/.global_step_4.tmp/optim.bin" ] && [ ! -e "$ck/global_step_4" ]
st=$?; expect "$name: step 4 only as .global_step_4.tmp, no global_step_4 ($(ls -A "$ck" | tr '\n' ' '))" "$st"
[ "$(cat "$ck/latest_checkpointed_iteration.txt" 2>/dev/null)" = 2 ] && [ -f "$ck/global_step_2/state.json" ]
expect "$name: latest_checkpointed_iteration.txt names step 2, whole: a relaunch now resumes from it" $?
rm -f "$HOLD" # the new lead goes on
wait "$JOB"
expect "$name: the run finishes without rank 0 (mpirun exits 0)" $?
says "$TMP/$name.log" "the checkpoint of step 4 was not in place when the lead was lost: writing it again"
expect "$name: the new lead says it writes step 4's checkpoint again" $?
[ ! -e "$ck/.global_step_4.tmp" ] && [ "$(cat "$ck/latest_checkpointed_iteration.txt" 2>/dev/null)" = "$STEPS" ]
st=$?; expect "$name: no .tmp left, latest_checkpointed_iteration.txt names step $STEPS ($(ls -A "$ck" | tr '\n' ' '))" "$st"
lead_survived "$name" 5

# (d) under grpod (heartbeats every 0.2 s, lost after 3 s of silence: start_grpod's)
EP="ipc://$TMP/ctl.sock"
export GRPOD_ENDPOINT="$EP"
start_grpod g
expect "grpod starts" $?
name=lead-grpod
start_held "$name" 3 gen:3:0,gen:5:1 grpod.endpoint="$EP" grpod.connect_timeout_s=20
kill_held "$name" "rank 0 at gen of step 3"
wait_for 60 held_or_ended
newlead="$(cat "$HOLD.held" 2>/dev/null)"
[ -n "$newlead" ]
expect "$name: the survivors redo step 3 and go on; the new lead holds at step 5 (pid ${newlead:-none})" $?
grep -q "^pid $newlead " "$TMP/$name/p/e/run.lock"
st=$?; expect "$name: the new lead holds the run directory's lock ($(cat "$TMP/$name/p/e/run.lock" 2>/dev/null))" "$st"
grpod_saw_survival "$name" 0 "survived: DP 3 -> 2 at step 3" running,running
rm -f "$HOLD" # the new lead goes on
wait "$JOB"
expect "$name: the run finishes without rank 0 (mpirun exits 0)" $?
finished() { state_is finished; }
wait_for 20 finished
st=$?; expect "$name: grpod says the run finished ($(status_field .state): $(status_field .reason))" "$st"
lead_survived "$name" 3
stop_grpod
finish
