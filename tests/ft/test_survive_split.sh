#!/usr/bin/env bash
# Trainer-loss survival in a split run (trainer.survive_trainer_loss with placement.rollout_ranks; docs/operations.md,
# "Surviving a lost trainer rank"): 3 plain-DP trainer ranks and 1 rollout rank of this build (against Open MPI 5)
# under scripts/mpirun_ft. The rollout rank sends each whole work unit to the lead (trainer rank 0, the
# dispatcher's), which hands each step's units to every trainer and keeps them for a redo (worker/split/
# split_survive.c):
#  - undisturbed: the weights equal one process's within 1e-5 (the lead's hand-out cuts each unit as the rollout
#    rank would have);
#  - trainer rank 1 SIGKILLed in step 3's gradient all-reduce (allreduce:3:1, a hold the test waits on, not a
#    sleep): the two others redo step 3 from the units the lead kept, nothing generated or sent again ("2 DP ranks go
#    on, step 3 redone"); the weights equal one process's within 1e-5, the audit files hold every group of every step
#    exactly rollout.n times, metrics.jsonl each step once;
#  - one-step-off (rollout.mode=async), trainer rank 2 killed in step 3's all-reduce while step 4's units wait at the
#    lead: the weights equal the undisturbed one-step-off run's within 1e-5, exactly-once audit files;
#  - the same under grpod (a second hold keeps the lead at step 5 while the test reads grpod): grpod shows rank 1 lost
#    with "survived: DP 3 -> 2 at step 3", the run, the other trainers and the rollout rank running past grpod's
#    heartbeat timeout, then the run finished; the weights one process's;
#  - the lead SIGKILLed in step 3's all-reduce (allreduce:3:0), on tcp endpoints as across hosts: trainer rank 1
#    takes the lead at the redo (its own data socket and dispatcher, which the rollout rank reaches) and step 3's
#    units are granted anew; the weights equal one process's within 1e-5, exactly-once audit files, metrics.jsonl
#    each step once; and again under grpod, which shows the lead lost and the run running, then finished;
#  - the same one-step-off, step 4's units waiting at the lead: the new lead also publishes the version step 3 is
#    generated with (from the step start it kept); the weights equal the undisturbed one-step-off run's within 1e-5,
#    exactly-once audit files;
#  - ZeRO-1 trainers: trainer rank 1 killed in step 3's optimizer step, then (on tcp) the lead: the lost block
#    rebuilt from the next trainer's copy, the moments re-sharded over 2; one process's weights, exactly-once audit
#    files, each step's metrics once;
#  - DP 2 x TP 2 trainers: a rank of the other copy killed (that copy leaves), then of the lead's copy (the other
#    takes the lead: its TP rank 0 the sockets, the lead alive in the copy that left closing its own); one
#    process's weights; and one-step-off with the lead's copy lost: the undisturbed one-step-off run's weights; DP 2 x
#    PP 2 trainers, the lead's copy's second stage killed: the other copy's first stage leads, one process's weights;
#  - multi-turn rollouts with validation at the end, DP 2 x TP 2 trainers, the lead's copy lost: the other copy
#    validates over its re-formed group; one process's weights and validation responses (answers included);
#  - refused by name: a split run with spares.
# Skipped (77) without Open MPI 5 (scripts/ompi5_env.sh --no-install).
set -u
. "$(dirname "$0")/../lib.sh" grpo-ft-split
# shellcheck source=tests/ft/survive_lib.sh
. "$(dirname "$0")/survive_lib.sh"
survive_start
TRAINERS=3
SPLIT=(placement.trainer_ranks=3 placement.rollout_ranks=1)

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 1 grpo-worker $(keys one) >"$TMP/one.log" 2>&1
expect "one process: $STEPS steps" $?

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 180)" "${MPIRUN[@]}" -np 4 grpo-worker $(keys whole) $(survive_keys 4) "${SPLIT[@]}" \
    >"$TMP/whole.log" 2>&1
expect "3 trainers and a rollout rank, undisturbed: $STEPS steps" $?
says "$TMP/whole.log" "trainer-loss survival on (trainer.survive_trainer_loss) in a split run"
expect "undisturbed: the lead says how a split run survives" $?
out=$("$COMPARE" "$(final one)" "$(final whole)" 1e-5 2>&1)
expect "undisturbed: weights equal one process's within 1e-5 ($out)" $?

start_held rank1 4 allreduce:3:1 "${SPLIT[@]}"
kill_held rank1 "trainer rank 1 in step 3's all-reduce"
wait "$JOB"
expect "rank1: the run finishes without trainer rank 1 (mpirun exits 0)" $?
survived rank1 3 1 2
says "$TMP/rank1.log" "(of 3 ranks, 2 survive)"
expect "rank1: DP 3 -> 2" $?
says "$TMP/rank1.log" "step 3 redone from the 1 work unit(s) this rank kept: none pulled again"
expect "rank1: the lead redoes step 3 from the units it kept" $?
same_as_one rank1
metrics_once rank1

# one-step-off (actor_rollout_ref.rollout.mode=async: step k+1's units are generated, and reach the lead, while step
# k trains): trainer rank 2 SIGKILLed in step 3's all-reduce; the survivors redo step 3 from the kept units while
# step 4's wait in the lead's pending list; the weights equal the undisturbed one-step-off run's within 1e-5
# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 180)" "${MPIRUN[@]}" -np 4 grpo-worker $(keys offwhole) $(survive_keys 4) "${SPLIT[@]}" \
    actor_rollout_ref.rollout.mode=async >"$TMP/offwhole.log" 2>&1
expect "one-step-off, undisturbed: $STEPS steps" $?
# same_as_off NAME: NAME's weights equal the undisturbed one-step-off run's within 1e-5, every group trained once
same_as_off() { same_as "$1" offwhole "the undisturbed one-step-off run"; }
start_held off 4 allreduce:3:2 "${SPLIT[@]}" actor_rollout_ref.rollout.mode=async
kill_held off "trainer rank 2 in step 3's all-reduce (one-step-off)"
wait "$JOB"
expect "off: the run finishes without trainer rank 2 (mpirun exits 0)" $?
survived off 3 2 2
same_as_off off
metrics_once off

# under grpod (a grpod of its own, socket ctl-NAME.sock): under_grpod NAME VICTIM HOLDER WHAT kills trainer
# rank VICTIM in step 3's all-reduce while trainer rank HOLDER will hold at step 5's (a second hold, released by the
# test): the survivors tell grpod, which shows VICTIM lost with "survived: DP 3 -> 2 at step 3" and keeps the run,
# the other trainers and the rollout rank running past its heartbeat timeout; then the run finishes and grpod says
# so; the weights one process's
# shellcheck disable=SC2034 # start_grpod (tests/lib.sh) runs $GRPOD
GRPOD="$(prog grpod)" GRPOCTL="$(prog grpoctl)"
finished() { state_is finished; }
under_grpod() {
    local name="$1" victim="$2" holder="$3"
    EP="ipc://$TMP/ctl-$name.sock"
    export GRPOD_ENDPOINT="$EP"
    start_grpod "g-$name"
    expect "$name: grpod starts" $?
    start_held "$name" 4 "allreduce:3:$victim,allreduce:5:$holder" "${SPLIT[@]}" grpod.endpoint="$EP" \
        grpod.connect_timeout_s=20
    kill_held "$name" "$4"
    wait_for 60 held_or_ended
    [ -s "$HOLD.held" ]
    expect "$name: the survivors redo step 3 and go on; trainer rank $holder holds at step 5" $?
    survived "$name" 3 "$victim" 2
    grpod_saw_survival "$name" "$victim" "survived: DP 3 -> 2 at step 3" running,running,running
    field_is ".workers[] | select(.rank == 3) | .role" rollout
    st=$?; expect "$name: grpod shows rank 3 a rollout rank, running on ($(status_field '.workers[] | select(.rank == 3) | .role'))" "$st"
    rm -f "$HOLD" # the holder goes on
    wait "$JOB"
    expect "$name: the run finishes without trainer rank $victim (mpirun exits 0)" $?
    wait_for 20 finished
    st=$?; expect "$name: grpod says the run finished ($(status_field .state): $(status_field .reason))" "$st"
    same_as_one "$name"
    kill "$GRPOD_PID" 2>/dev/null
    wait "$GRPOD_PID" 2>/dev/null
    unset GRPOD_ENDPOINT
}
under_grpod gr 1 0 "trainer rank 1 in step 3's all-reduce"

# the lead SIGKILLed in step 3's all-reduce, on tcp (as across hosts: the data endpoints at PORT + d, the
# dispatcher at PORT + 3): trainer rank 1, the survivors' DP rank 0, takes the lead at the redo (its data socket,
# and the dispatcher at its lead endpoint, PORT + 1 + 128, which the rollout rank is connected to already) and
# grants step 3's units anew; the weights equal one process's within 1e-5, every group trained exactly once,
# metrics.jsonl each step once
PORT=$((10000 + RANDOM % 20000))
start_held lead 4 allreduce:3:0 "${SPLIT[@]}" grpod.data_endpoint="tcp://*:$PORT"
kill_held lead "the lead in step 3's all-reduce"
wait "$JOB"
expect "lead: the run finishes without the lead (mpirun exits 0)" $?
survived lead 3 0 2
says "$TMP/lead.log" "[rank 1] trainer: dispatching 1 work unit(s) per step at tcp://*:$((PORT + 129))" &&
    says "$TMP/lead.log" "step 3: this rank (launch DP rank 1) leads the split run now: pulling rollouts at tcp://*:$((PORT + 1))"
expect "lead: trainer rank 1 takes the lead at step 3's redo, dispatching at its lead endpoint" $?
[ "$(grep -c "\[rank 3\] rollout: finished: the trainers finished after step $STEPS (6 unit(s) generated here)" \
    "$TMP/lead.log")" -eq 1 ]
expect "lead: the rollout rank generated step 3's unit again, 6 units in all, and heard the end" $?
same_as_one lead
metrics_once lead

# the same under grpod (ipc), the new lead holding at step 5
under_grpod grlead 0 1 "the lead in step 3's all-reduce"

# one-step-off: the lead SIGKILLed in step 3's all-reduce while step 4's units wait at it; trainer rank 1 takes the
# lead with the policy version step 3 is generated with (version 1, the weights at step 2's start, which it kept)
# and its own (version 2, for step 4): steps 3 and 4 are generated again as the lost lead had them; the weights
# equal the undisturbed one-step-off run's within 1e-5, every group trained exactly once
start_held leadoff 4 allreduce:3:0 "${SPLIT[@]}" actor_rollout_ref.rollout.mode=async
kill_held leadoff "the lead in step 3's all-reduce (one-step-off)"
wait "$JOB"
expect "leadoff: the run finishes without the lead (mpirun exits 0)" $?
survived leadoff 3 0 2
says "$TMP/leadoff.log" "leads the split run now: pulling rollouts at " &&
    says "$TMP/leadoff.log" "granted anew (one-step-off: with the policy version kept from the step before)"
expect "leadoff: trainer rank 1 takes the lead with the version of the step before" $?
same_as_off leadoff
metrics_once leadoff

# with ZeRO-1 trainers: trainer rank 1 killed in step 3's optimizer step (its block rebuilt from trainer rank 2's
# copy), and the lead killed there on tcp (its block rebuilt from trainer rank 1's, which takes the lead); each
# re-shards the moments over 2 and ends at one process's weights, every group trained exactly once
ZERO=actor_rollout_ref.actor.megatron.use_distributed_optimizer=true
start_held zrank1 4 optim:3:1 "${SPLIT[@]}" "$ZERO"
kill_held zrank1 "trainer rank 1 in step 3's optimizer step (ZeRO-1)"
wait "$JOB"
expect "zrank1: the run finishes without trainer rank 1 (mpirun exits 0)" $?
says "$TMP/zrank1.log" "ZeRO-1: DP rank 2 keeps the optimizer state of parameters"
expect "zrank1: ZeRO-1 over the 3 trainers" $?
survived zrank1 3 1 2
same_as_one zrank1
metrics_once zrank1
PORT=$((10000 + RANDOM % 20000))
start_held zlead 4 optim:3:0 "${SPLIT[@]}" "$ZERO" grpod.data_endpoint="tcp://*:$PORT"
kill_held zlead "the lead in step 3's optimizer step (ZeRO-1)"
wait "$JOB"
expect "zlead: the run finishes without the lead (mpirun exits 0)" $?
survived zlead 3 0 2
says "$TMP/zlead.log" "leads the split run now: pulling rollouts at tcp://"
expect "zlead: trainer rank 1 takes the lead" $?
same_as_one zlead
metrics_once zlead

# TP trainers (DP 2 x TP 2: 4 trainer ranks and a rollout rank): trainer rank 3 (of the other copy) killed in step
# 3's optimizer step: its copy leaves (launch rank 2 idle), the lead's copy goes on as DP 1; then trainer rank 1 (of
# the lead's copy): that copy leaves, its lead, alive, closes its dispatcher and data socket, and the other copy
# takes the lead (its TP rank 0 the sockets, both ranks their parts of each version); one process's weights, every
# group trained exactly once, each step's metrics once. One-step-off with the lead's copy lost: the new lead copy
# also assembles the version of the step before from its ranks' kept parts; the undisturbed one-step-off run's
# weights.
# copy_lost NAME VICTIM WHAT KEY KEYS...: 4 trainer ranks (2 model copies of 2: KEY=2) and a rollout rank, trainer
# rank VICTIM killed in step 3's optimizer step; the run finishes, the copy that lost it left, the other went on
copy_lost() {
    local name="$1" victim="$2" what="$3" key="$4"
    shift 4
    TRAINERS=4 start_held "$name" 5 "optim:3:$victim" placement.trainer_ranks=4 placement.rollout_ranks=1 "$key=2" "$@"
    kill_held "$name" "trainer rank $victim in step 3's optimizer step ($what)"
    wait "$JOB"
    expect "$name: $what, the run finishes without trainer rank $victim (mpirun exits 0)" $?
}
TP=actor_rollout_ref.actor.megatron.tensor_model_parallel_size
copy_lost tpother 3 "DP 2 x TP 2 trainers" "$TP"
survived tpother 3 3 1
says "$TMP/tpother.log" "(of 2 DP ranks, 1 survive; TP 2 x PP 1: the copy that lost it left, launch rank 2 idle)"
expect "tpother: the other copy left, launch rank 2 idle" $?
same_as_one tpother
metrics_once tpother
copy_lost tplead 1 "DP 2 x TP 2 trainers, the lead's copy" "$TP"
survived tplead 3 1 1
says "$TMP/tplead.log" "[rank 0] trainer: the lead's model copy left: its dispatcher and data socket close here" &&
    says "$TMP/tplead.log" "[rank 2] trainer: step 3: this rank (launch DP rank 1) leads the split run now"
expect "tplead: the lead's copy left, closing its sockets; the other copy's TP rank 0 takes the lead" $?
same_as_one tplead
metrics_once tplead
copy_lost tpleadoff 1 "DP 2 x TP 2 trainers one-step-off, the lead's copy" "$TP" actor_rollout_ref.rollout.mode=async
says "$TMP/tpleadoff.log" "granted anew (one-step-off: with the policy version kept from the step before)"
expect "tpleadoff: the new lead copy publishes the version of the step before" $?
same_as_off tpleadoff
# PP trainers (DP 2 x PP 2: launch ranks 0 and 2 the lead's copy, its stages 0 and 1): trainer rank 2 killed in step
# 3's optimizer step; the lead's copy leaves and the other copy's first stage (launch rank 1) takes the lead
copy_lost pplead 2 "DP 2 x PP 2 trainers, stage 1 of the lead's copy" \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size
survived pplead 3 2 1
says "$TMP/pplead.log" "[rank 1] trainer: step 3: this rank (launch DP rank 1) leads the split run now"
expect "pplead: the other copy's first stage takes the lead" $?
same_as_one pplead
metrics_once pplead

# multi-turn rollouts with validation at the last step, the lead's TP copy lost: the other copy validates over its
# re-formed group (its first rank's interaction telling the other each answer over the new group); one process's
# weights, and its validation's multi-turn responses, answers included
cat >"$TMP/again.yaml" <<'YAML'
interaction:
  - name: again
    class_name: grpo.interactions.Retry
    config:
      message: Again.
YAML
# validation sampled (4 answers per prompt at temperature 1: greedy answers of the trained tiny model end no turn)
MT=(data.max_response_length=96 actor_rollout_ref.rollout.multi_turn.enable=true
    actor_rollout_ref.rollout.multi_turn.interaction_config_path="$TMP/again.yaml"
    actor_rollout_ref.rollout.multi_turn.max_user_turns=2 trainer.test_freq="$STEPS"
    actor_rollout_ref.rollout.val_kwargs.do_sample=true actor_rollout_ref.rollout.val_kwargs.temperature=1.0
    actor_rollout_ref.rollout.val_kwargs.n=4)
# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 1 grpo-worker $(keys onemt) "${MT[@]}" \
    trainer.validation_data_dir="$TMP/onemt/val" >"$TMP/onemt.log" 2>&1
expect "one process, multi-turn with validation: $STEPS steps" $?
copy_lost tpmt 1 "DP 2 x TP 2 trainers, multi-turn, the lead's copy" "$TP" "${MT[@]}" \
    trainer.validation_data_dir="$TMP/tpmt/val"
survived tpmt 3 1 1
same_as tpmt onemt "the multi-turn process"
out=$(python3 "$SRC_ROOT/tests/mpi/same_val_dumps.py" "$TMP/onemt/val" "$TMP/tpmt/val" "Again." 2>&1)
expect "tpmt: the surviving copy's validation gives one process's multi-turn responses ($out)" $?

# refused by name
# shellcheck disable=SC2046
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 5 grpo-worker $(keys nokey) $(survive_keys 5) "${SPLIT[@]}" \
    trainer.survive_spare_ranks=1 >"$TMP/spares.log" 2>&1
[ $? -ne 0 ] && says "$TMP/spares.log" "trainer.survive_trainer_loss with rollout ranks (placement.rollout_ranks, a split run) and trainer.survive_spare_ranks > 0 is not covered yet"
expect "a split run with spares: refused, naming the keys" $?
finish
