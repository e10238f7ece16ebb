#!/usr/bin/env bash
# grpoctl diagnose on real split runs under grpod, each made to be one kind of bound with the test-only keys
# test.delay_phase and test.delay_s (a rank sleeps on entering that phase): a slow update (trainer-bound), a slow
# generation (rollout-bound), one slow rollout rank of two (a straggler, named by rank), a slow weight sync
# (weight-sync-bound). Each verdict comes with its numbers and the keys to turn; the opposite verdict is not
# given; the status page's /api/status carries the same findings; a finished run keeps its verdict across a
# restart of grpod.
# usage: test_diagnose.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/grpod_lib.sh"
WORKER="$(prog grpo-worker)" MODEL_TOOL="$(prog grpo-model)"
test_env
tiny_model "$TMP/tiny"
expect "tiny model" $?

# run NAME ROLLOUT_RANKS [key=value ...]: grpod and a 1-trainer split run of 5 steps under it, to the end;
# grpoctl diagnose's output in $TMP/NAME.diag, its JSON in $TMP/NAME.json; grpod stays up (stop_grpod ends it)
run() {
    local name="$1" nr="$2"; shift 2
    start_grpod "$name" placement.trainer_ranks=1 placement.rollout_ranks="$nr" || { fail "$name: grpod starts"; return; }
    local keys
    tiny_run keys "$TMP/$name.runs" 5
    mpirun --oversubscribe --bind-to none -np $((1 + nr)) "$WORKER" "${keys[@]}" placement.trainer_ranks=1 \
        placement.rollout_ranks="$nr" grpod.endpoint="$EP" grpod.connect_timeout_s=30 "$@" >"$TMP/$name.log" 2>&1
    expect "$name: the run ends with 0" $?
    "$GRPOCTL" diagnose >"$TMP/$name.diag" 2>&1
    expect "$name: grpoctl diagnose answers" $?
    "$GRPOCTL" diagnose --json >"$TMP/$name.json" 2>&1
    sed 's/^/     | /' "$TMP/$name.diag"
}
# kinds NAME: the kinds of NAME's findings, worst first, comma-separated
kinds() { jq -r '[.[].kind] | join(",")' "$TMP/$1.json"; }

run trainer 1 test.delay_phase=update_actor test.delay_s=0.4
says "$TMP/trainer.diag" "trainer-bound: the 1 rollout rank(s) idle"; expect "slow update: trainer-bound" $?
says "$TMP/trainer.diag" "on-policy)"; expect "slow update: on-policy said" $?
says "$TMP/trainer.diag" "turn: run colocated"; expect "slow update: run colocated is the first knob" $?
has "$TMP/trainer.diag" "actor_rollout_ref.rollout.mode=async"; expect "slow update: async named" $?
[ "$(jq -r '.[0].kind' "$TMP/trainer.json")" = trainer_bound ]; expect "slow update: the worst finding (JSON)" $?
! kinds trainer | grep -q rollout_bound; rc=$?
expect "slow update: not rollout-bound ($(kinds trainer))" $rc
"$GRPOCTL" status >"$TMP/trainer.status"
says "$TMP/trainer.status" "diagnosis   trainer-bound"; expect "grpoctl status shows the worst finding" $?
url="$(status_field .http_url)"
[ "$(curl -sf "$url/api/status" | jq -r '.diagnosis[0].text')" = "$(jq -r '.[0].text' "$TMP/trainer.json")" ]
expect "the status page's /api/status carries the same verdict" $?
curl -sf "$url/" | grep -q 'id="diagnosis"'; expect "the status page has a diagnosis section" $?
stop_grpod

run rollout 1 test.delay_phase=gen test.delay_s=0.4
says "$TMP/rollout.diag" "rollout-bound: the 1 trainer rank(s) idle"; expect "slow generation: rollout-bound" $?
says "$TMP/rollout.diag" "more rollout ranks"; expect "slow generation: more rollout ranks is a knob" $?
! kinds rollout | grep -q trainer_bound; rc=$?
expect "slow generation: not trainer-bound ($(kinds rollout))" $rc
stop_grpod

# world rank 2 is the second rollout rank: it alone sleeps
run straggler 2 test.delay_phase=gen "test.delay_s=[0,0,0.4]"
says "$TMP/straggler.diag" "straggler: rank 2 (rollout on host"; expect "one slow rollout rank: a straggler, rank 2" $?
! has "$TMP/straggler.diag" "straggler: rank 1"; expect "one slow rollout rank: rank 1 is not named" $?
! kinds straggler | grep -q long_tail; rc=$?
expect "one slow rollout rank: not a long tail ($(kinds straggler))" $rc
stop_grpod
# a finished run keeps its verdict when grpod restarts on its journal
start_grpod straggler placement.trainer_ranks=1 placement.rollout_ranks=2
"$GRPOCTL" diagnose >"$TMP/straggler2.diag" 2>&1
says "$TMP/straggler2.diag" "straggler: rank 2 (rollout on host"; expect "after a restart of grpod: the same verdict" $?
stop_grpod

# colocated ranks (no split), work stealing off, rank 1 slow to start each step's generation: a straggler
start_grpod colocated || fail "colocated: grpod starts"
tiny_run keys "$TMP/colocated.runs" 5
mpirun --oversubscribe --bind-to none -np 2 "$WORKER" "${keys[@]}" trainer.nnodes=1 trainer.n_gpus_per_node=2 \
    placement.colocated_steal=false grpod.endpoint="$EP" grpod.connect_timeout_s=30 \
    test.delay_phase=gen "test.delay_s=[0,0.4]" >"$TMP/colocated.log" 2>&1
expect "colocated: the run ends with 0" $?
"$GRPOCTL" diagnose >"$TMP/colocated.diag" 2>&1
"$GRPOCTL" diagnose --json >"$TMP/colocated.json" 2>&1
sed 's/^/     | /' "$TMP/colocated.diag"
says "$TMP/colocated.diag" "straggler: rank 1 (hybrid on host"; expect "colocated, rank 1 slow each step: a straggler, rank 1" $?
! kinds colocated | grep -Eq "trainer_bound|rollout_bound"; rc=$?
expect "colocated: neither trainer- nor rollout-bound ($(kinds colocated))" $rc
stop_grpod

run sync 1 test.delay_phase=weight_sync test.delay_s=0.4
says "$TMP/sync.diag" "weight-sync-bound: moving the weights takes 0.4"; expect "slow weight sync: weight-sync-bound" $?
says "$TMP/sync.diag" "actor_rollout_ref.rollout.weight_sync=broadcast"; expect "slow weight sync: broadcast named" $?
stop_grpod
finish
