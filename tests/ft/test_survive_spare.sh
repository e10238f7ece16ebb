#!/usr/bin/env bash
# Trainer-loss survival with a spare rank (trainer.survive_spare_ranks=1; docs/operations.md, "Surviving a lost
# trainer rank"): 4 ranks of this build (against Open MPI 5) under scripts/mpirun_ft, 3 colocated plain-DP ranks
# and launch rank 3 a spare that waits outside every collective of a step:
#  - undisturbed: the spare is released at the end, never joins, and the weights equal one process's within 1e-5;
#  - rank 2 SIGKILLed at step 3, its generation done (gen:3:2, a hold the test waits on, not a sleep): the spare
#    takes its place, DP stays 3 ("3 DP ranks go on, step 3 redone"), the spare's log says it took the step's start
#    from DP rank 0 (launch rank 0); the weights equal one process's within 1e-5, the audit files hold every group
#    of every step exactly rollout.n times, metrics.jsonl each step once;
#  - the lead (rank 0) SIGKILLed at step 3 (gen:3:0): the spare joins, rank 1 leads and sends it the state (launch
#    rank 1), the same checks;
#  - two losses (rank 2 at step 2's generation, rank 1 in step 4's all-reduce): the spare takes the first's place
#    (DP 3), the second shrinks DP to 2 as without spares, the weights one process's;
#  - ZeRO-1 (each DP rank one block of AdamW's moments): rank 1 SIGKILLed in step 3's optimizer step; its block
#    is rebuilt from rank 2's copy and the moments re-sharded over the two survivors and the spare (DP stays 3),
#    the weights one process's;
#  - the spare itself SIGKILLed while it waits (the "spare" hold): the run finishes, the lead says at the end that the
#    spare was lost rather than released; the same and then rank 2 lost at step 3: no spare joins, DP 3 -> 2;
#  - refused by name: the key without trainer.survive_trainer_loss.
# Skipped (77) without Open MPI 5 (scripts/ompi5_env.sh --no-install).
set -u
. "$(dirname "$0")/../lib.sh" grpo-ft-spare
# shellcheck source=tests/ft/survive_lib.sh
. "$(dirname "$0")/survive_lib.sh"
survive_start
SPARES=1

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 1 grpo-worker $(keys one) >"$TMP/one.log" 2>&1
expect "one process: $STEPS steps" $?

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 180)" "${MPIRUN[@]}" -np 4 grpo-worker $(keys whole) $(survive_keys 4) >"$TMP/whole.log" 2>&1
expect "3 colocated ranks and a spare, undisturbed: $STEPS steps" $?
says "$TMP/whole.log" "1 spare rank(s) (trainer.survive_spare_ranks, launch ranks 3..3)" &&
    says "$TMP/whole.log" "spare (launch rank 3) released: the run ended without needing it" &&
    says "$TMP/whole.log" "3 colocated ranks (hybrid: each generates and trains), DP 3"
expect "undisturbed: DP 3 over ranks 0..2, the spare waits and is released at the end" $?
! grep -q "joined as DP rank" "$TMP/whole.log"
expect "undisturbed: the spare never joined" $?
out=$("$COMPARE" "$(final one)" "$(final whole)" 1e-5 2>&1)
expect "undisturbed: weights equal one process's within 1e-5 ($out)" $?

# joined NAME STEP RANK PEER: the spare took the lost rank RANK's place at step STEP as DP rank 2 of 3, from DP
# rank 0 (launch rank PEER), and the run is one process's
joined() {
    says "$TMP/$1.log" "spare (launch rank 3) joined as DP rank 2 of 3 for step $2: took the step's start" &&
        grep -aF "spare (launch rank 3) joined as DP rank 2 of 3 for step $2" "$TMP/$1.log" |
        grep -qF "from DP rank 0 (launch rank $4)"
    expect "$1: the spare joined as DP rank 2 of 3 at step $2, the state from launch rank $4" $?
    survived "$1" "$2" "$3" 3
    says "$TMP/$1.log" "(of 3 ranks, 2 survive; 1 spare(s) joined, 0 left)"
    expect "$1: DP stays 3 (2 of 3 survive, the spare joined)" $?
}

start_held rank2 4 gen:3:2
kill_held rank2 "rank 2 at gen of step 3"
wait "$JOB"
expect "rank2: the run finishes without rank 2 (mpirun exits 0)" $?
joined rank2 3 2 0
same_as_one rank2
metrics_once rank2

start_held lead 4 gen:3:0
kill_held lead "the lead at gen of step 3"
wait "$JOB"
expect "lead: the run finishes without rank 0 (mpirun exits 0)" $?
joined lead 3 0 1
says "$TMP/lead.log" "the lead (rank 0) lost: rank 1 leads from step 3"
expect "lead: rank 1 leads from step 3" $?
same_as_one lead
metrics_once lead

start_held twice 4 gen:2:2,allreduce:4:1
kill_twice twice "rank 2 at gen of step 2" "rank 1 in step 4's all-reduce"
expect "twice: the run finishes without ranks 2 and 1 (mpirun exits 0)" $?
survived twice 2 2 3 "$T_FIRST"
says "$TMP/twice.log" "spare (launch rank 3) joined as DP rank 2 of 3 for step 2"
expect "twice: the spare took rank 2's place at step 2" $?
survived twice 4 1 2
says "$TMP/twice.log" "rank 1 lost at step 4; 2 DP ranks go on, step 4 redone (of 3 ranks, 2 survive)"
expect "twice: no spare left, DP 3 -> 2 at step 4" $?
same_as_one twice

# ZeRO-1: rank 1 SIGKILLed in step 3's optimizer step (optim:3:1), its block only in rank 2's copy: the survivors
# and the spare re-shard the moments over the 3 of them (the spare's block from that), DP stays 3; every ZeRO-1 DP
# layout reproduces one process's run, so the weights are one process's
start_held zero 4 optim:3:1 actor_rollout_ref.actor.megatron.use_distributed_optimizer=true
kill_held zero "rank 1 in step 3's optimizer step (ZeRO-1)"
wait "$JOB"
expect "zero: the run finishes without rank 1 (mpirun exits 0)" $?
says "$TMP/zero.log" "ZeRO-1: DP rank 0 keeps the optimizer state of parameters"
expect "zero: ZeRO-1 is on" $?
says "$TMP/zero.log" "spare (launch rank 3) joined as DP rank 2 of 3 for step 3: took the step's start (weights, AdamW's step count, its ZeRO-1 block of the moments re-sharded over the survivors"
expect "zero: the spare joined as DP rank 2 of 3 at step 3 with its ZeRO-1 block" $?
survived zero 3 1 3
says "$TMP/zero.log" "(of 3 ranks, 2 survive; 1 spare(s) joined, 0 left)"
expect "zero: DP stays 3 (2 of 3 survive, the spare joined)" $?
same_as_one zero
metrics_once zero

# the spare itself lost while it waits (held by GRPO_TEST_KILL_AT's "spare" point, SIGKILLed): nothing waits for
# it; at the run's end the lead finds it gone instead of releasing it, and the run finishes as one process's
start_held sparelost 4 spare:1:3
kill_held sparelost "the spare (launch rank 3) at its wait"
wait "$JOB"
expect "sparelost: the run finishes without its spare (mpirun exits 0)" $?
says "$TMP/sparelost.log" "spare (launch rank 3) was lost while it waited: nothing to release"
expect "sparelost: the lead says the spare was lost, not released" $?
# its mpirun was seen (1 CI run in many) not to end the job after the survivors' MPI_Finalize: the lead, which found
# the spare gone, must know the job lost a rank, so that its end does not wait for it
says "$TMP/sparelost.log" "[rank 0] worker: this job lost a rank: if MPI_Finalize waits for it"
expect "sparelost: the lead knows at its end that the job lost a rank" $?
same_as_one sparelost
# ... and then a trainer lost: no spare is left to join, DP shrinks (the shrink names both)
# (the trainers go on while the spare holds: rank 2 reaches its own hold before the test takes the spare's, and
# waits its turn; the test takes the spare's only then, so that one hold overwriting the other would show)
start_held sparethen 4 spare:1:3,gen:3:2
second_waits() { has "$TMP/sparethen.log" "at gen of step 3, waiting for another rank's hold to be taken"; }
wait_for 150 second_waits
expect "sparethen: rank 2 reaches its hold while the spare's is untaken, and waits its turn" $?
spare_pid="$(sed -n 's/.*\[rank 3\] survive: test: holding at spare of step 1 .*(pid \([0-9]*\)).*/\1/p' "$TMP/sparethen.log")"
[ -n "$spare_pid" ] && [ "$(cat "$HOLD.held" 2>/dev/null)" = "$spare_pid" ]
expect "sparethen: the hold to take first is the spare's (pid ${spare_pid:-none})" $?
kill_held sparethen "the spare (launch rank 3) at its wait"
kill_held sparethen "rank 2 at gen of step 3"
wait "$JOB"
expect "sparethen: the run finishes without its spare and rank 2 (mpirun exits 0)" $?
says "$TMP/sparethen.log" "ranks 2 and 3 lost at step 3; 2 DP ranks go on, step 3 redone (of 3 ranks, 2 survive)"
expect "sparethen: the lost spare joins nobody: DP 3 -> 2 at step 3" $?
same_as_one sparethen

# refused by name
# shellcheck disable=SC2046
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 3 grpo-worker $(keys nokey) trainer.nnodes=1 trainer.n_gpus_per_node=2 \
    trainer.survive_spare_ranks=1 >"$TMP/nokey.log" 2>&1
[ $? -ne 0 ] && says "$TMP/nokey.log" "trainer.survive_spare_ranks needs trainer.survive_trainer_loss=true"
expect "spares without trainer.survive_trainer_loss: refused, naming both keys" $?
finish
