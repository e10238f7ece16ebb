#!/usr/bin/env bash
# grpoctl stop --wait with two plain data-parallel trainers (issue 26, no ZeRO/TP/PP: only DP rank 0 writes the
# checkpoint): a split run of a tiny model, 2 trainers + 1 rollout rank under grpod and mpirun, is stopped
# mid-run; grpoctl stop --wait exits 0, every rank exits 0, and every trainer reports the stop's checkpoint (the
# replica the one its leader wrote).
# usage: test_stop_dp.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/grpod_lib.sh"
test_env
. "$(dirname "$0")/tiny_split.sh"
tiny_split "$TMP"
expect "tiny model and split run configuration" $?
KEYS=(trainer.n_gpus_per_node=2 trainer.total_training_steps=400 trainer.save_freq=-1)
start_grpod g --config "$TMP/split.yaml" "${KEYS[@]}"
expect "grpod starts" $?
mpirun --oversubscribe --bind-to none -np 3 "$WORKER" --config "$TMP/split.yaml" "${KEYS[@]}" \
    grpod.endpoint="$EP" grpod.connect_timeout_s=20 >"$TMP/run.log" 2>&1 &
MPI_PID=$!
track "$MPI_PID"
wait_for 60 step_at_least 2; expect "2 trainers and a rollout rank register and step" $?
"$GRPOCTL" stop --wait="$(scaled 60)" >"$TMP/stop.out" 2>&1
rc=$?
cat "$TMP/stop.out"
[ $rc -eq 0 ]; expect "grpoctl stop --wait exits 0 with two plain DP trainers" $?
wait "$MPI_PID"; expect "every rank of the stopped run exits 0" $?
sstep="$(cat "$TMP/runs/p/e/checkpoints/latest_checkpointed_iteration.txt" 2>/dev/null)"
[ -n "$sstep" ] && [ "$sstep" -lt 400 ] && [ -f "$TMP/runs/p/e/checkpoints/global_step_$sstep/actor/model.safetensors" ]
expect "the stop wrote its checkpoint mid-run (step $sstep)" $?
[ -n "$sstep" ] && [ "$(status_field '[.workers[] | select(.role == "trainer") | .checkpoint_step] | join(",")')" = "$sstep,$sstep" ]
chk=$?; expect "both trainers report the stop's checkpoint, step $sstep ($(status_field '[.workers[].checkpoint_step]|join(",")'))" $chk
! grep -q "without writing its checkpoint" "$TMP/stop.out"; expect "grpoctl names no trainer that did not checkpoint" $?
stop_grpod
finish
