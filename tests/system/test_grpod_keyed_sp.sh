#!/usr/bin/env bash
# grpod given the run's keys places SP and CP ranks as the workers do (issue 40, item 3): a split run of 2
# trainer ranks (Ulysses SP 2, then Megatron CP 2: one DP rank) + 1 rollout rank, tiny model; grpod started with
# the same configuration and keys as the ranks assigns each the role and DP coordinates it computes itself (trainer
# dp 0/1 twice, rollout dp 0/1), every rank registers and the run finishes. Before, grpod dropped the SP/CP size
# and assigned dp 0/2, and every rank refused its assignment.
# usage: test_grpod_keyed_sp.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/grpod_lib.sh"
. "$(dirname "$0")/tiny_split.sh"
tiny_split "$TMP"
expect "tiny model and split run configuration" $?
# keyed NAME KEY: grpod (state NAME) and the 3 ranks given the run's configuration, 2 trainer ranks and KEY=2
keyed() {
    local name="$1" key="$2"
    local KEYS=(trainer.n_gpus_per_node=2 trainer.default_local_dir="$TMP/runs-$name" "$key=2")
    start_grpod "$name" --config "$TMP/split.yaml" "${KEYS[@]}"
    expect "$name: grpod starts with the run's configuration and keys ($key=2)" $?
    grep -q "checking every rank against grpod's own keys, placement included" "$TMP/$name.log"
    expect "$name: grpod lays the run out from its own keys" $?
    mpirun --oversubscribe --bind-to none -np 3 "$WORKER" --config "$TMP/split.yaml" "${KEYS[@]}" \
        grpod.endpoint="$EP" >"$TMP/$name-run.log" 2>&1
    rc=$?
    expect "$name: the job finishes (mpirun exit $rc: $(grep -o 'grpod assigned.*' "$TMP/$name-run.log" | head -1))" $rc
    [ "$(grep -c 'registered with grpod at .*role trainer, dp 0/1' "$TMP/$name-run.log")" -eq 2 ] &&
        [ "$(grep -c 'registered with grpod at .*role rollout, dp 0/1' "$TMP/$name-run.log")" -eq 1 ]
    expect "$name: grpod assigned both trainer ranks trainer dp 0/1 and the rollout rank rollout dp 0/1" $?
    ! grep -q "grpod assigned role" "$TMP/$name-run.log"; expect "$name: no rank refused its assignment" $?
    roles="$(status_field '[.workers[].role] | join(",")')"
    [ "$roles" = "trainer,trainer,rollout" ]; expect "$name: grpod's workers: trainer,trainer,rollout ($roles)" $?
    state="$(status_field .state)" step="$(status_field .step)"
    [ "$state" = finished ] && [ "$step" = 3 ]; expect "$name: the run finished its 3 steps ($state, step $step)" $?
    stop_grpod
}
keyed sp2 actor_rollout_ref.actor.ulysses_sequence_parallel_size
keyed cp2 actor_rollout_ref.actor.megatron.context_parallel_size
finish
