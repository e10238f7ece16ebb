#!/usr/bin/env bash
# Trainer-loss survival (trainer.survive_trainer_loss) at more points of a step than ft-survive's, 3 colocated
# plain-DP ranks of this build (against Open MPI 5) under scripts/mpirun_ft, a checkpoint every 2 steps; each
# victim held at its point by GRPO_TEST_KILL_AT (worker/survive/survive.h: a hold the test waits on, not a sleep)
# and SIGKILLed there:
#  - rank 2 in step 3's forwards (its old log-probs taken, the reference's not: logprob:3:2);
#  - rank 1 in step 2's optimizer step (the first mini-batch's gradients summed, its AdamW step not taken:
#    optim:2:1);
#  - rank 2 in its part of step 2's checkpoint (ckpt:2:2; the lead writes it, and finds the loss in step 3);
#    each: the run finishes (mpirun exits 0), the log names the loss and the redone step, the weights equal one
#    process's within 1e-5 relative, the audit files hold every group of every step exactly rollout.n times, and
#    the checkpoints written (steps 2 and 4) equal one process's too;
#  (the lead in the middle of its checkpoint: ft-survive-lead, test_survive_lead.sh.)
# Skipped (77) without Open MPI 5 (scripts/ompi5_env.sh --no-install).
set -u
. "$(dirname "$0")/../lib.sh" grpo-ft-points
SAVE_FREQ=2 # read by survive_lib.sh
# shellcheck source=tests/ft/survive_lib.sh
. "$(dirname "$0")/survive_lib.sh"
survive_start

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 1 grpo-worker $(keys one) >"$TMP/one.log" 2>&1
expect "one process: $STEPS steps" $?

# killed POINT STEP RANK FOUND: rank RANK held at POINT of step STEP and SIGKILLed there; its loss found in step FOUND
killed() {
    local name="$1-$2-$3" out k
    start_held "$name" 3 "$1:$2:$3"
    kill_held "$name" "rank $3 at $1 of step $2"
    wait "$JOB"
    expect "$name: the run finishes without rank $3 (mpirun exits 0)" $?
    survived "$name" "$4" "$3" 2
    same_as_one "$name"
    metrics_once "$name"
    checkpoints_as_one "$name"
}
killed logprob 3 2 3
killed optim 2 1 2
killed ckpt 2 2 3

finish
