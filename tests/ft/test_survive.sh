#!/usr/bin/env bash
# Trainer-loss survival (trainer.survive_trainer_loss; docs/operations.md, "Open MPI 5 with fault tolerance (ULFM)")
# on 3 colocated plain-DP ranks of this build (against Open MPI 5) under scripts/mpirun_ft:
#  - undisturbed with the key on: the weights after 5 steps equal one process's within 1e-5; each step's metrics
#    say the time keeping its start took at the step's start (timing_s/keep_step_start, part of timing_s/step), and
#    rank 0 that the copy is made by each step's first optimizer step;
#  - rank 2 SIGKILLed at step 3, its generation done (its peers waiting for it: GRPO_TEST_KILL_AT=gen:3:2, a hold
#    the test waits on, not a sleep), and rank 1 SIGKILLed in step 2's gradient all-reduce (its buckets started,
#    its peers waiting on them: allreduce:2:1): the run finishes (mpirun exits 0), rank 0 says "rank R lost at step
#    K; 2 DP ranks go on, step K redone" and how long after the loss the redone step completed, the weights equal
#    one process's within 1e-5 relative (every DP layout reproduces it, so the survivors' DP 2 from step K on does
#    too), and the audit files hold every group of every step exactly rollout.n times (the redone step's file is the
#    one written);
#  - (the lead's loss, survived since: ft-survive-lead, test_survive_lead.sh)
#  - refused by name: sequence parallelism (SP 2; TP and PP: ft-survive-tp), and under Open MPI 5's mpirun without --with-ft ulfm.
# Skipped (77) without Open MPI 5 (scripts/ompi5_env.sh --no-install).
set -u
. "$(dirname "$0")/../lib.sh" grpo-ft-survive
# shellcheck source=tests/ft/survive_lib.sh
. "$(dirname "$0")/survive_lib.sh"
survive_start

read -ra SURVIVE <<<"$(survive_keys 3)"

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 1 grpo-worker $(keys one) >"$TMP/one.log" 2>&1
expect "one process: $STEPS steps" $?

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 180)" "${MPIRUN[@]}" -np 3 grpo-worker $(keys whole) "${SURVIVE[@]}" >"$TMP/whole.log" 2>&1
expect "3 colocated ranks with the key on, undisturbed: $STEPS steps" $?
says "$TMP/whole.log" "trainer-loss survival on (trainer.survive_trainer_loss)"
expect "rank 0 says survival is on" $?
# no MPI one-sided lock where a rank may be lost (Open MPI 5 does not support one-sided memory after a failure):
# stealing goes through each host's lock-free ledger
says "$TMP/whole.log" "an idle engine takes the unstarted units of its host's slowest one (a lock-free ledger"
expect "work stealing goes through each host's lock-free ledger, and rank 0 says so" $?
out=$("$COMPARE" "$(final one)" "$(final whole)" 1e-5 2>&1)
expect "undisturbed: weights equal one process's within 1e-5 ($out)" $?
# the key's cost is in the step's time: keeping each step's start (here, on the CPU without ZeRO-1, a copy each step's
# first optimizer step makes as it goes: next to nothing at the step's start), and the gradients' all-reduce
out=$(python3 -c 'import json, sys
rs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert len(rs) == int(sys.argv[2]), len(rs)
for r in rs:
    k, s, a = r["timing_s/keep_step_start"], r["timing_s/step"], r["timing_s/grad_allreduce"]
    assert 0 <= k < s and 0 < a < s, r
print("step %d: kept in %.4f of %.3f s" % (rs[-1]["step"], rs[-1]["timing_s/keep_step_start"], rs[-1]["timing_s/step"]))' \
    "$TMP/whole/p/e/metrics.jsonl" "$STEPS" 2>&1)
expect "undisturbed: each step's timing_s/keep_step_start and timing_s/grad_allreduce, within timing_s/step ($out)" $?
says "$TMP/whole.log" "survive: step 1's start kept by its first optimizer step"
expect "undisturbed: rank 0 says the first optimizer step keeps each step's start" $?

# killed POINT STEP RANK: a run of 3 ranks whose rank RANK holds at POINT of step STEP and is SIGKILLed there
killed() {
    local name="$1-$2-$3"
    start_held "$name" 3 "$1:$2:$3"
    kill_held "$name" "rank $3 at $1 of step $2"
    wait "$JOB"
    expect "$name: the run finishes without rank $3 (mpirun exits 0)" $?
    survived "$name" "$2" "$3" 2
    same_as_one "$name"
    metrics_once "$name"
}
killed gen 3 2
killed allreduce 2 1

# refused by name
# shellcheck disable=SC2046
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 4 grpo-worker $(keys sp) trainer.nnodes=1 trainer.n_gpus_per_node=4 \
    trainer.survive_trainer_loss=true actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 >"$TMP/sp.log" 2>&1
[ $? -ne 0 ] && says "$TMP/sp.log" \
    "trainer.survive_trainer_loss with actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 is not covered yet"
expect "SP 2 and the key: refused, naming the key and SP" $?
# shellcheck disable=SC2046
OPAL_PREFIX="$OMPI5_PREFIX" timeout "$(scaled 120)" "$OMPI5_PREFIX/bin/mpirun" --oversubscribe -np 2 "$WORKER" \
    $(keys noft) trainer.nnodes=1 trainer.n_gpus_per_node=2 trainer.survive_trainer_loss=true >"$TMP/noft.log" 2>&1
[ $? -ne 0 ] && says "$TMP/noft.log" "trainer.survive_trainer_loss: this launch did not turn MPI's fault tolerance on"
expect "without mpirun --with-ft ulfm: refused, naming the key and the launch" $?
finish
