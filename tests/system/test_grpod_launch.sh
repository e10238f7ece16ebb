#!/usr/bin/env bash
# deploy/grpo-launch-workers end to end: mpirun starts the workers of a hostfile
# (simulated workers first, then real grpo-worker ranks with a trainer and a rollout
# role on a tiny model), they register with grpod under their MPI ranks, train,
# and finish; grpoctl sees it all. The launcher watches the job through grpoctl (GRPOCTL) and leaves a job that
# ends by itself alone: exit 0, nothing ended by it.
# usage: test_grpod_launch.sh (the launcher of this source tree; the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/grpod_lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export GRPOCTL # the launcher's watch asks grpod through it
echo "localhost slots=2" >"$TMP/hostfile"
printf 'grpod:\n  connect_timeout_s: 30\n' >"$TMP/run.yaml"
"$SRC_ROOT/deploy/grpo-launch-workers" --help | grep -q hostfile; expect "launcher --help" $?
"$SRC_ROOT/deploy/grpo-launch-workers" --hostfile "$TMP/none" --config "$TMP/run.yaml" >"$TMP/err" 2>&1
[ $? -eq 2 ]; expect "launcher: missing hostfile exits 2" $?
start_grpod g1
GRPO_WORKER="$SIM" "$SRC_ROOT/deploy/grpo-launch-workers" --hostfile "$TMP/hostfile" --config "$TMP/run.yaml" \
    --endpoint "$EP" -- --steps 8 --step-ms 30 --state "$TMP/m%r.state" >"$TMP/mpi.log" 2>&1
expect "mpirun launch of 2 workers from the hostfile ends with 0" $?
[ -f "$TMP/m0.state" ] && [ -f "$TMP/m1.state" ]; expect "both ranks wrote their state" $?
state_is finished; expect "run finished" $?
[ "$(status_field '[.workers[].rank] | join(",")')" = "0,1" ]; expect "ranks 0 and 1 registered" $?
[ "$(status_field .step)" = 8 ]; expect "8 steps" $?
stop_grpod

# real workers: 1 trainer + 1 rollout rank from the hostfile, the split in the run's YAML (verl's keys)
. "$(dirname "$0")/tiny_split.sh"
tiny_split "$TMP"
expect "tiny model and split run configuration" $?
start_grpod g2 --config "$TMP/split.yaml"
OPENBLAS_NUM_THREADS=1 GRPO_WORKER="$WORKER" "$SRC_ROOT/deploy/grpo-launch-workers" --hostfile "$TMP/hostfile" \
    --config "$TMP/split.yaml" --endpoint "$EP" >"$TMP/real.log" 2>&1
expect "grpo-launch-workers runs a trainer and a rollout rank to the end" $?
! grep -q "not watched\|Ending mpirun" "$TMP/mpi.log" "$TMP/real.log"
expect "the launcher watched both jobs and ended neither" $?
[ "$(status_field '[.workers[].role] | join(",")')" = "trainer,rollout" ]; expect "grpod assigned trainer and rollout" $?
[ "$(status_field .step)" = 3 ]; expect "3 steps" $?
[ -f "$TMP/runs/p/e/checkpoints/global_step_3/actor/model.safetensors" ]; expect "the trainer wrote the final checkpoint" $?
finish
