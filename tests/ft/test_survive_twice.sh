#!/usr/bin/env bash
# Trainer-loss survival (trainer.survive_trainer_loss) of two losses in one run: 4 colocated plain-DP ranks of this
# build (against Open MPI 5) under scripts/mpirun_ft; rank 3 SIGKILLed at step 2, its generation done (gen:2:3), then
# rank 1 in step 4's gradient all-reduce (allreduce:4:1), each held there by GRPO_TEST_KILL_AT (worker/survive/
# survive.h: a hold the test waits on, not a sleep). The run finishes (mpirun exits 0) on 2 ranks; the log names
# each loss, its shrink (4 -> 3 at step 2, 3 -> 2 at step 4) and its redone step; the weights equal one process's
# within 1e-5 relative (every DP layout reproduces them, so DP 4, 3 and 2 in turn do too), and the audit files hold
# every group of every step exactly rollout.n times.
# Skipped (77) without Open MPI 5 (scripts/ompi5_env.sh --no-install).
set -u
. "$(dirname "$0")/../lib.sh" grpo-ft-twice
# shellcheck source=tests/ft/survive_lib.sh
. "$(dirname "$0")/survive_lib.sh"
survive_start

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 1 grpo-worker $(keys one) >"$TMP/one.log" 2>&1
expect "one process: $STEPS steps" $?

start_held twice 4 gen:2:3,allreduce:4:1
kill_twice twice "rank 3 at gen of step 2" "rank 1 in step 4's all-reduce"
expect "twice: the run finishes without ranks 3 and 1 (mpirun exits 0)" $?
survived twice 2 3 3 "$T_FIRST"
survived twice 4 1 2
says "$TMP/twice.log" "(of 4 ranks, 3 survive)" && says "$TMP/twice.log" "(of 3 ranks, 2 survive)"
expect "twice: 4 ranks -> 3 -> 2" $?
same_as_one twice
finish
