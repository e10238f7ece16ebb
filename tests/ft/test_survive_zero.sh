#!/usr/bin/env bash
# Trainer-loss survival (trainer.survive_trainer_loss) with ZeRO-1 (actor_rollout_ref.actor.megatron.
# use_distributed_optimizer=true: each DP rank keeps one block of AdamW's moments, and, with the key, a copy of the
# previous DP rank's block taken at each step's start): colocated plain-DP ranks of this build (against Open MPI 5)
# under scripts/mpirun_ft, each victim held by GRPO_TEST_KILL_AT (worker/survive/survive.h) and SIGKILLed there:
#  - 3 ranks, rank 1 in step 3's optimizer step (optim:3:1): its block is rebuilt from rank 2's copy, the moments
#    re-sharded over 2 ranks;
#  - 4 ranks, rank 3 at step 2 after its generation (gen:2:3: rank 0 holds its copy, a wrap-around), then rank 1 in
#    step 4's optimizer step (optim:4:1): 4 -> 3 -> 2, re-sharded twice.
#  - 3 ranks, the lead (rank 0) in the middle of step 4's checkpoint (ckpt:4:0, a checkpoint every 2 steps): the
#    survivors find the loss in the next step's start (each block's copy to the next rank), redo step 4 with rank 1
#    leading (rank 0's block rebuilt from rank 1's copy), and metrics.jsonl holds each step once;
#  - 3 ranks, rank 2 in its part of step 4's checkpoint (ckpt:4:2): the lead, which had logged step 4, redoes it
#    and metrics.jsonl still holds it once (the lead's files reopened after step 3).
# Each run finishes (mpirun exits 0) and ends at the weights of a reference that used the smaller DP from the redone
# step on: an undisturbed ZeRO-1 run of 2 ranks (every ZeRO-1 DP layout reproduces one process's run: checked too),
# within 1e-5 relative; the audit files hold every group of every step exactly rollout.n times.
#  - 4 ranks, ranks 1 and 2 both held at step 3 after their generation and SIGKILLed together (gen:3:1,gen:3:2; the
#    test waits for both holds' log lines): rank 1's block is lost with its copy, and the survivors end the run
#    saying so, mpirun exiting non-zero by itself (twice).
# Skipped (77) without Open MPI 5 (scripts/ompi5_env.sh --no-install).
set -u
. "$(dirname "$0")/../lib.sh" grpo-ft-zero
# shellcheck source=tests/ft/survive_lib.sh
. "$(dirname "$0")/survive_lib.sh"
survive_start
ZERO=actor_rollout_ref.actor.megatron.use_distributed_optimizer=true

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 1 grpo-worker $(keys one) >"$TMP/one.log" 2>&1
expect "one process: $STEPS steps" $?
# the reference: ZeRO-1 over 2 ranks, undisturbed (the survivors' layout from the redone step on)
# shellcheck disable=SC2046
timeout "$(scaled 180)" "${MPIRUN[@]}" -np 2 grpo-worker $(keys ref2) $(survive_keys 2) "$ZERO" >"$TMP/ref2.log" 2>&1
expect "reference: ZeRO-1 on 2 ranks, $STEPS steps" $?
says "$TMP/ref2.log" "ZeRO-1: DP rank 0 keeps the optimizer state of parameters"
expect "reference: ZeRO-1 is on" $?
out=$("$COMPARE" "$(final one)" "$(final ref2)" 1e-5 2>&1)
expect "reference: equals one process's within 1e-5 ($out)" $?

same_as_ref2() {
    local out
    out=$("$COMPARE" "$(final ref2)" "$(final "$1")" 1e-5 2>&1)
    expect "$1: weights equal the 2-rank ZeRO-1 reference's within 1e-5 ($out)" $?
    same_as_one "$1"
}

start_held z3 3 optim:3:1 "$ZERO"
kill_held z3 "rank 1 in step 3's optimizer step"
wait "$JOB"
expect "z3: the run finishes without rank 1 (mpirun exits 0)" $?
says "$TMP/z3.log" "ZeRO-1: DP rank 2 keeps the optimizer state of parameters"
expect "z3: ZeRO-1 over 3 ranks" $?
survived z3 3 1 2
same_as_ref2 z3

start_held z4 4 gen:2:3,optim:4:1 "$ZERO"
kill_twice z4 "rank 3 at gen of step 2" "rank 1 in step 4's optimizer step"
expect "z4: the run finishes without ranks 3 and 1 (mpirun exits 0)" $?
survived z4 2 3 3 "$T_FIRST"
survived z4 4 1 2
same_as_ref2 z4

# the lead mid-checkpoint; its block rebuilt from rank 1's copy, rank 1 leading
SAVE_FREQ=2 start_held zlead 3 ckpt:4:0 "$ZERO"
kill_held zlead "rank 0 in the middle of step 4's checkpoint"
wait "$JOB"
expect "zlead: the run finishes without rank 0 (mpirun exits 0)" $?
survived zlead 4 0 2
says "$TMP/zlead.log" "the lead (rank 0) lost: rank 1 leads from step 4"
expect "zlead: launch rank 1 says it leads from step 4" $?
same_as_ref2 zlead
metrics_once zlead
ck="$TMP/zlead/p/e/checkpoints"
[ -f "$ck/global_step_4/state.json" ] && [ ! -e "$ck/.global_step_4.tmp" ] &&
    [ "$(cat "$ck/latest_checkpointed_iteration.txt" 2>/dev/null)" = "$STEPS" ]
expect "zlead: the redone step 4's checkpoint in place, no .tmp left, the latest step $STEPS" $?

# a non-lead rank in its part of the checkpoint: step 4, logged by the lead already, redone
SAVE_FREQ=2 start_held zpart 3 ckpt:4:2 "$ZERO"
kill_held zpart "rank 2 in its part of step 4's checkpoint"
wait "$JOB"
expect "zpart: the run finishes without rank 2 (mpirun exits 0)" $?
survived zpart 4 2 2
same_as_ref2 zpart
metrics_once zpart

# two neighbours at once: the block of the first is lost with its copy on the second. Twice: the survivors' end
# once raced mpirun (MPI_Abort under --with-ft ulfm: mpirun exited 0, or waited for ever, one time in four)
for adj in adj adj2; do
    start_held "$adj" 4 gen:3:1,gen:3:2 "$ZERO"
    both_held() { [ "$(grep -c "test: holding at gen of step 3" "$TMP/$adj.log")" -ge 2 ] || ! kill -0 "$JOB" 2>/dev/null; }
    wait_for 150 both_held
    pids="$(sed -n 's/.*test: holding at gen of step 3 .*(pid \([0-9]*\)).*/\1/p' "$TMP/$adj.log" | sort -u | tr '\n' ' ')"
    [ "$(echo $pids | wc -w)" -eq 2 ]
    expect "$adj: ranks 1 and 2 hold at step 3 (pids $pids)" $?
    # shellcheck disable=SC2086 # the two pids
    kill -9 $pids
    expect "$adj: both SIGKILLed" $?
    wait "$JOB"
    rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]
    expect "$adj: the run ends with an error, mpirun ending by itself (exit status $rc; 124: its time limit)" $?
    says "$TMP/$adj.log" "ZeRO-1: DP rank 1's block of the optimizer state was kept by DP rank 2, lost too"
    expect "$adj: the survivors say rank 1's block was lost with its copy" $?
done
finish
