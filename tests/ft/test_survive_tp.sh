#!/usr/bin/env bash
# Trainer-loss survival over model copies of TP or PP ranks (trainer.survive_trainer_loss; docs/operations.md,
# "Surviving a lost trainer rank"): colocated ranks of this build (against Open MPI 5) under scripts/mpirun_ft,
# 4 steps:
#  - DP 2 x TP 2 on 4 ranks, rank 1 SIGKILLed at step 3, its generation done (gen:3:1, a hold the test waits on,
#    not a sleep): its copy (ranks 0 and 1, the lead's) leaves, rank 0 says why and stays idle until the run ends,
#    rank 2 leads the other copy on as DP 1 ("rank 1 lost at step 3; 1 DP ranks go on, step 3 redone"); mpirun
#    exits 0, the weights equal one process's within 1e-5 relative (every TP layout reproduces it: ft-tp's
#    equivalence), the audit files hold every group of every step exactly rollout.n times, metrics.jsonl each step
#    once;
#  - DP 2 x PP 2 on 4 ranks, rank 3 (stage 1 of DP rank 1) SIGKILLed at step 2, a mini-batch's gradients summed
#    and its optimizer step not taken (optim:2:3): DP rank 1's copy (ranks 1 and 3) leaves, the same checks;
#  - two losses, DP 3 x TP 2 on 6 ranks: rank 5 at step 2 (gen:2:5), then the lead at step 4 (optim:4:0): DP 3 -> 2 -> 1,
#    launch ranks 4 and 1 idle, launch rank 2 leads; the same checks;
#  - DP 1 x TP 2 on 2 ranks, a checkpoint every 2 steps, rank 1 SIGKILLed at step 3: the lost shard has no replica:
#    the run stops (mpirun exits non-zero) with a reason naming rank 1 and the checkpoint of step 2 a relaunch
#    resumes from;
#  - DP 2 x TP 2 and a spare on 5 ranks, rank 1 SIGKILLed at step 3: the spare takes its place (TP rank 1 of DP rank
#    0), that shard's step start (weights, AdamW's moments, the reference) from its replica on DP rank 1 (launch
#    rank 3), DP stays 2; mpirun exits 0, one process's weights, exactly-once audit files, each step's metrics once;
#    and DP 2 x PP 2 with a spare, rank 3 (stage 1 of DP rank 1) killed at step 3: the spare takes that stage from
#    DP rank 0's (launch rank 2), the same checks.
#  - DP 3 x TP 2 with ZeRO-1 on 6 ranks, rank 3 SIGKILLed in step 3's optimizer step: its copy leaves, each TP
#    position's block of DP rank 1 rebuilt from DP rank 2's copy of it, the moments re-sharded over 2 copies; the
#    same checks.
#  - DP 2 x TP 2 with ZeRO-1 and a spare, rank 1 killed at step 3: the spare takes its place, the lost block rebuilt
#    at its TP position only from DP rank 1's copy, re-sharded over DP rank 1 and the spare; the same checks.
#  - refused by name: a spare with TP 2 and LoRA.
# Skipped (77) without Open MPI 5 (scripts/ompi5_env.sh --no-install).
set -u
. "$(dirname "$0")/../lib.sh" grpo-ft-survive-tp
STEPS=4
# shellcheck source=tests/ft/survive_lib.sh
. "$(dirname "$0")/survive_lib.sh"
survive_start
TP=actor_rollout_ref.actor.megatron.tensor_model_parallel_size
PP=actor_rollout_ref.actor.megatron.pipeline_model_parallel_size

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 1 grpo-worker $(keys one) >"$TMP/one.log" 2>&1
expect "one process: $STEPS steps" $?

# copy_left NAME STEP RANK IDLE: rank RANK's loss at step STEP survived by the other copy (DP 2 -> 1), launch rank
# IDLE (its copy's other rank) left, stayed idle and was released at the end; one process's run
copy_left() {
    local name="$1" step="$2" rank="$3" idle="$4"
    survived "$name" "$step" "$rank" 1
    says "$TMP/$name.log" "(of 2 DP ranks, 1 survive; TP $5 x PP $6: the copy that lost it left, launch rank $idle idle)"
    expect "$name: DP 2 -> 1, the copy of rank $rank left (launch rank $idle idle)" $?
    says "$TMP/$name.log" "launch rank $idle (" &&
        grep -aF "launch rank $idle (" "$TMP/$name.log" | grep -qF "leaves the training: its model copy lost rank $rank at step $step"
    expect "$name: launch rank $idle says it leaves and why" $?
    says "$TMP/$name.log" "launch rank $idle released: the run ended"
    expect "$name: launch rank $idle idle until the run's end, then released" $?
    same_as_one "$name"
    metrics_once "$name"
}

start_held tp 4 gen:3:1 "$TP=2"
kill_held tp "rank 1 at gen of step 3"
wait "$JOB"
expect "tp: DP 2 x TP 2, the run finishes without rank 1 (mpirun exits 0)" $?
copy_left tp 3 1 0 2 1
says "$TMP/tp.log" "the lead (rank 0) lost or left with its model copy: rank 2 leads from step 3"
expect "tp: the lead's copy left, rank 2 leads from step 3" $?

start_held pp 4 optim:2:3 "$PP=2"
kill_held pp "rank 3 at the optimizer step of step 2"
wait "$JOB"
expect "pp: DP 2 x PP 2, the run finishes without rank 3 (mpirun exits 0)" $?
copy_left pp 2 3 1 1 2

# two losses: DP 3 x TP 2 on 6 ranks, rank 5 at step 2 (DP rank 2's copy leaves, launch rank 4 idle), then rank 0
# at step 4 (the lead's copy leaves, launch rank 1 idle too; launch rank 2 leads): DP 3 -> 2 -> 1
start_held twice 6 gen:2:5,optim:4:0 "$TP=2"
kill_twice twice "rank 5 at gen of step 2" "the lead at the optimizer step of step 4"
expect "twice: DP 3 x TP 2, the run finishes without ranks 5 and 0 (mpirun exits 0)" $?
survived twice 2 5 2 "$T_FIRST"
says "$TMP/twice.log" "rank 5 lost at step 2; 2 DP ranks go on, step 2 redone (of 3 DP ranks, 2 survive; TP 2 x PP 1: the copy that lost it left, launch rank 4 idle)"
expect "twice: DP 3 -> 2 at step 2, launch rank 4 idle" $?
survived twice 4 0 1
says "$TMP/twice.log" "rank 0 lost at step 4; 1 DP ranks go on, step 4 redone (of 2 DP ranks, 1 survive; TP 2 x PP 1: the copy that lost it left, launch ranks 1,4 idle)" &&
    says "$TMP/twice.log" "the lead (rank 0) lost or left with its model copy: rank 2 leads from step 4"
expect "twice: DP 2 -> 1 at step 4, launch ranks 1 and 4 idle, rank 2 leads" $?
says "$TMP/twice.log" "launch rank 4 released: the run ended" && says "$TMP/twice.log" "launch rank 1 released: the run ended"
expect "twice: both idle ranks released at the end" $?
same_as_one twice
metrics_once twice

SAVE_FREQ=2
start_held dp1 2 gen:3:1 "$TP=2"
kill_held dp1 "rank 1 at gen of step 3"
wait "$JOB"
rc=$?
[ "$rc" -ne 0 ]
expect "dp1: DP 1 x TP 2 cannot go on without rank 1 (mpirun exits $rc)" $?
says "$TMP/dp1.log" "rank 1 lost at step 3: no model copy of TP 2 x PP 1 ranks is left whole (DP 1: the lost rank's shard has no replica)" &&
    says "$TMP/dp1.log" "the run stops. A relaunch resumes from the checkpoint $TMP/dp1/p/e/checkpoints/global_step_2"
expect "dp1: the stop names rank 1 and the checkpoint of step 2 a relaunch resumes from" $?
SAVE_FREQ=-1

# with a spare: it takes rank 1's place (TP rank 1 of DP rank 0), that shard rebuilt from DP rank 1's (launch
# rank 3), DP stays 2
SPARES=1
start_held spare 5 gen:3:1 "$TP=2"
kill_held spare "rank 1 at gen of step 3"
wait "$JOB"
expect "spare: DP 2 x TP 2 and a spare, the run finishes without rank 1 (mpirun exits 0)" $?
survived spare 3 1 2
says "$TMP/spare.log" "spare (launch rank 4) took launch rank 1's place (TP rank 1, PP stage 0 of DP rank 0 of 2) for step 3" &&
    grep -aF "spare (launch rank 4) took launch rank 1's place" "$TMP/spare.log" |
    grep -qF "from its replica on DP rank 1 (launch rank 3)"
expect "spare: launch rank 4 took rank 1's place, its shard from its replica on launch rank 3" $?
says "$TMP/spare.log" "(of 2 DP ranks, 1 survive; TP 2 x PP 1: 1 spare(s) took the lost ranks' places, 0 spare(s) left)"
expect "spare: DP stays 2, no copy left" $?
! grep -q "leaves the training" "$TMP/spare.log"
expect "spare: no rank left its copy" $?
same_as_one spare
metrics_once spare

# the same under PP: DP 2 x PP 2 and a spare, rank 3 (stage 1 of DP rank 1) killed at step 3: the spare takes that
# stage, from DP rank 0's (launch rank 2)
start_held ppspare 5 gen:3:3 "$PP=2"
kill_held ppspare "rank 3 at gen of step 3"
wait "$JOB"
expect "ppspare: DP 2 x PP 2 and a spare, the run finishes without rank 3 (mpirun exits 0)" $?
survived ppspare 3 3 2
says "$TMP/ppspare.log" "spare (launch rank 4) took launch rank 3's place (TP rank 0, PP stage 1 of DP rank 1 of 2) for step 3" &&
    grep -aF "spare (launch rank 4) took launch rank 3's place" "$TMP/ppspare.log" |
    grep -qF "from its replica on DP rank 0 (launch rank 2)"
expect "ppspare: launch rank 4 took rank 3's stage, from its replica on launch rank 2" $?
same_as_one ppspare
metrics_once ppspare

SPARES=0
# with ZeRO-1: DP 3 x TP 2 on 6 ranks, rank 3 (TP rank 1 of DP rank 1) killed in step 3's optimizer step: DP rank
# 1's copy (launch ranks 2 and 3) leaves; at each TP position its ZeRO-1 block is rebuilt from DP rank 2's copy of
# it and the moments re-sharded over the 2 copies left
start_held zero 6 optim:3:3 "$TP=2" actor_rollout_ref.actor.megatron.use_distributed_optimizer=true
kill_held zero "rank 3 in step 3's optimizer step"
wait "$JOB"
expect "zero: DP 3 x TP 2 with ZeRO-1, the run finishes without rank 3 (mpirun exits 0)" $?
says "$TMP/zero.log" "ZeRO-1: DP rank 2 keeps the optimizer state of parameters"
expect "zero: ZeRO-1 over the 3 copies" $?
survived zero 3 3 2
says "$TMP/zero.log" "(of 3 DP ranks, 2 survive; TP 2 x PP 1: the copy that lost it left, launch rank 2 idle)"
expect "zero: DP 3 -> 2, the copy of rank 3 left (launch rank 2 idle)" $?
same_as_one zero
metrics_once zero

# ZeRO-1 and a spare: DP 2 x TP 2 and a spare on 5 ranks, rank 1 (TP rank 1 of DP rank 0) killed at step 3's
# generation: the spare takes its place; at TP position 1 the lost block is rebuilt from DP rank 1's copy of it and
# the moments re-sharded over DP rank 1 and the spare (which joins with no block); at TP position 0 nothing is lost
SPARES=1 start_held zspare 5 gen:3:1 "$TP=2" actor_rollout_ref.actor.megatron.use_distributed_optimizer=true
kill_held zspare "rank 1 at gen of step 3"
wait "$JOB"
expect "zspare: DP 2 x TP 2 with ZeRO-1 and a spare, the run finishes without rank 1 (mpirun exits 0)" $?
says "$TMP/zspare.log" "ZeRO-1: DP rank 1 keeps the optimizer state of parameters"
expect "zspare: ZeRO-1 over the 2 copies" $?
survived zspare 3 1 2
says "$TMP/zspare.log" "spare (launch rank 4) took launch rank 1's place (TP rank 1, PP stage 0 of DP rank 0 of 2) for step 3"
expect "zspare: the spare took rank 1's shard" $?
same_as_one zspare
metrics_once zspare

# refused by name: a spare with TP and LoRA (each rank refuses alike and ends at once)
SPARES=1
# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 5 grpo-worker $(keys lora) $(survive_keys 5) "$TP=2" \
    actor_rollout_ref.model.lora_rank=4 >"$TMP/lora.log" 2>&1
[ $? -ne 0 ] && says "$TMP/lora.log" "trainer.survive_spare_ranks with actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 and LoRA (actor_rollout_ref.model.lora_rank) is not covered yet"
expect "a spare with TP 2 and LoRA: refused, naming the keys" $?

finish
