#!/usr/bin/env bash
# SIGTERM in split runs (2 trainer + 1 rollout ranks under mpirun, as Slurm signals them: every rank): trainer
# DP rank 0 stops the run at its next safe point after a checkpoint, the rollout rank ends when the trainers'
# dispatcher says so, every rank exits 0. A second signal ends a rank at once (here a trainer stuck waiting for a
# frozen rollout rank, so no safe point comes). deploy/slurm/grpo.sbatch, run unchanged with stand-ins for srun
# and scontrol: Slurm's early warning before the time limit (--signal=B:USR1@..., to the batch shell) becomes
# one SIGTERM to every worker, and scancel's or preemption's SIGTERM to every task and the batch shell is not
# doubled by it; either way the job ends with a checkpoint and exit 0.
# usage: test_sigterm_split.sh SRC_DIR GRPOD GRPOCTL GRPO_WORKER GRPO_MODEL
set -u
src="$(realpath "$1")" GRPOD="$2" GRPOCTL="$3" WORKER="$4" MODEL_TOOL="$5"
. "$(dirname "$0")/../lib.sh" grpo-sigterm
test_env
# rank_pid RANK MPIRUN_PID: the pid of a rank (mpirun starts the local ranks as its children)
rank_pid() {
    local p
    for p in $(pgrep -P "$2"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && echo "$p"
    done
}

tiny_model "$TMP/tiny"
expect "tiny model initialised" $?
COMMON=(actor_rollout_ref.model.path="$TMP/tiny" trainer.project_name=p trainer.experiment_name=e
    trainer.total_training_steps=100000 trainer.val_before_train=false trainer.test_freq=-1 data.train_batch_size=2
    actor_rollout_ref.rollout.n=2 actor_rollout_ref.actor.ppo_mini_batch_size=2 data.max_response_length=8
    data.synthetic.num_train=16 data.synthetic.num_val=2 placement.trainer_ranks=2 placement.rollout_ranks=1)

# ---- every rank gets SIGTERM, as under Slurm
mpirun --oversubscribe --bind-to none -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/s" \
    >"$TMP/s.log" 2>&1 &
MP=$!
track "$MP"
wait_for 90 steps_logged "$TMP/s/p/e/metrics.jsonl" 2; expect "the split run trains" $?
ranks=$(pgrep -P "$MP" | tr '\n' ' ')
[ "$(echo $ranks | wc -w)" -eq 3 ]; expect "three ranks under mpirun ($ranks)" $?
kill -TERM $ranks
wait_for 60 sh -c "! kill -0 $MP"; expect "the job ends within a minute" $?
wait "$MP"; rc=$?
[ "$rc" -eq 0 ]; expect "mpirun exits 0: every rank stopped cleanly (got $rc)" $?
s="$(cat "$TMP/s/p/e/checkpoints/latest_checkpointed_iteration.txt" 2>/dev/null)"
[ -n "$s" ] && [ "$s" -ge 2 ]; expect "trainer DP rank 0 wrote the checkpoint of step $s" $?
grep -q "\[rank 0\] trainer: SIGTERM: stopping at step $s, after a checkpoint" "$TMP/s.log"
expect "DP rank 0 decided the stop" $?
grep -q "\[rank 2\] rollout: stopped: the trainers stopped after step $s" "$TMP/s.log"
expect "the rollout rank ended with the trainers" $?
! grep -q "worker: rank [0-9] failed" "$TMP/s.log"; expect "no rank failed" $?

# ---- a second signal ends a rank at once (the trainers wait for a frozen rollout rank: no safe point comes)
mpirun --oversubscribe --bind-to none -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/t" \
    >"$TMP/t.log" 2>&1 &
MP=$!
track "$MP"
wait_for 90 steps_logged "$TMP/t/p/e/metrics.jsonl" 1; expect "the second split run trains" $?
r2="$(rank_pid 2 "$MP")"
r0="$(rank_pid 0 "$MP")"
[ -n "$r2" ] && [ -n "$r0" ]; expect "rank 0 ($r0) and rank 2 ($r2) found" $?
kill -STOP "$r2"
track "$r2"
stopped() { [ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" = T ]; }
wait_for 10 stopped "$r2"; expect "rank 2 is stopped" $?
kill -TERM "$r0"
wait_for 10 grep -q "\[rank 0\] worker: SIGTERM received" "$TMP/t.log"; expect "the first SIGTERM is taken" $?
# rank 0's main thread goes round its wait 20 times after the signal was taken (past the point where it would
# have ended), and is still there
sw=$(switches "$r0")
wait_for 30 ran_since "$r0" 20 "$sw"; r=$?
kill -0 "$r0" 2>/dev/null && [ "$r" -eq 0 ]; expect "rank 0 still waits for its safe point" $?
sleep 1.2 # the same signal within a second of the first is the same request (coreutils timeout sends two)
kill -TERM "$r0"
wait_for 20 sh -c "! kill -0 $MP"; expect "the second SIGTERM ends the job at once" $?
wait "$MP"; rc=$?
[ "$rc" -ne 0 ]; expect "mpirun exits non-zero (got $rc)" $?
grep -q "\[rank 0\] worker: SIGTERM received after SIGTERM: ending now, without a checkpoint" "$TMP/t.log"
expect "rank 0 logs why it ends at once" $?

# ---- deploy/slurm/grpo.sbatch: the time limit's early warning and scancel
mkdir -p "$TMP/bin"
ln -s "$(realpath "$GRPOD")" "$TMP/bin/grpod"
ln -s "$(realpath "$WORKER")" "$TMP/bin/grpo-worker"
cat >"$TMP/bin/scontrol" <<'SH'
#!/bin/sh
[ "$1 $2" = "show hostnames" ] && { echo 127.0.0.1; exit 0; }
exit 1
SH
cat >"$TMP/bin/srun" <<'SH'
#!/bin/bash
# srun [options] CMD...: with --ntasks=1 run CMD here; otherwise the tasks under mpirun, and like srun, a
# signal to srun goes to every task
one=0
while [ $# -gt 0 ]; do
    case "$1" in --ntasks=1) one=1; shift ;; --*) shift ;; *) break ;; esac
done
[ $one -eq 1 ] && exec "$@"
mpirun --oversubscribe --bind-to none -np "$SLURM_NTASKS" "$@" &
mp=$!
trap 'kill -TERM $(pgrep -P $mp) 2>/dev/null' TERM INT
rc=0
wait $mp || rc=$?
while kill -0 $mp 2>/dev/null; do rc=0; wait $mp || rc=$?; done
exit $rc
SH
chmod +x "$TMP/bin/scontrol" "$TMP/bin/srun"
cat >"$TMP/split.yaml.in" <<YAML
data: {train_batch_size: 2, max_response_length: 8, synthetic: {num_train: 16, num_val: 2}}
actor_rollout_ref:
  model: {path: $TMP/tiny}
  rollout: {n: 2}
  actor: {ppo_mini_batch_size: 2}
trainer: {nnodes: 1, n_gpus_per_node: 1, total_training_steps: 100000, val_before_train: false, test_freq: -1,
          default_local_dir: @RUNS@, project_name: p, experiment_name: e}
rollout: {nnodes: 1, n_gpus_per_node: 1}
grpod: {connect_timeout_s: 30}
YAML
grep -q "^#SBATCH --signal=B:USR1@" "$src/deploy/slurm/grpo.sbatch"; expect "grpo.sbatch asks for an early signal" $?
# the grpo-worker processes under PID (the batch shell): srun stand-in -> mpirun -> ranks
workers_under() {
    local p
    for p in $(pgrep -P "$1"); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = grpo-worker ] && echo "$p"
        workers_under "$p"
    done
}
# slurm_job NAME: grpo.sbatch in the background as Slurm runs it (pid in JOB), its run under $TMP/NAME
slurm_job() {
    sed "s|@RUNS@|$TMP/$1|" "$TMP/split.yaml.in" >"$TMP/$1.yaml"
    local port=$(( 10000 + RANDOM % 20000 )) # below the ephemeral ports (32768-60999): no outgoing connection holds it
    ( cd "$TMP" && PATH="$TMP/bin:$PATH" SLURM_JOB_NODELIST=localhost SLURM_JOB_ID=4343 SLURM_NTASKS=2 \
        GRPOD_PORT=$port GRPOD_HTTP=127.0.0.1:0 GRPO_RUN_DIR="$TMP/$1.job" \
        exec bash "$src/deploy/slurm/grpo.sbatch" "$TMP/$1.yaml" >"$TMP/$1.log" 2>&1 ) &
    JOB=$!
    track "$JOB"
}
# slurm_stopped NAME WHAT: the job ended cleanly after WHAT, with a checkpoint and grpod's record
slurm_stopped() {
    wait_for 60 sh -c "! kill -0 $JOB"; expect "$2: the job ends within a minute" $?
    wait "$JOB"; local rc=$?
    [ "$rc" -eq 0 ]; expect "$2: the batch script exits 0 (got $rc)" $?
    local s
    s="$(cat "$TMP/$1/p/e/checkpoints/latest_checkpointed_iteration.txt" 2>/dev/null)"
    [ -n "$s" ]; expect "$2: the job checkpointed (step $s)" $?
    grep -q "SIGTERM: stopping at step $s" "$TMP/$1.log"; expect "$2: trainer DP rank 0 stopped at step $s" $?
    grep -q "run stopped at step $s" "$TMP/$1.log"; expect "$2: the run stopped cleanly" $?
    ! grep -q "ending now, without a checkpoint" "$TMP/$1.log"; expect "$2: no worker took a second signal" $?
}

# what --signal=B:USR1@120 does ahead of the time limit: SIGUSR1 to the batch shell alone
slurm_job limit
wait_for 90 steps_logged "$TMP/limit/p/e/metrics.jsonl" 2; expect "the Slurm job trains" $?
kill -USR1 "$JOB"
slurm_stopped limit "time limit near"
grep -q "stop requested by SIGTERM on rank 0" "$TMP/limit.job/grpod/events.log" 2>/dev/null
expect "grpod recorded the stop" $?

# what scancel and preemption do: SIGTERM to every task and to the batch shell
slurm_job cancel
wait_for 90 steps_logged "$TMP/cancel/p/e/metrics.jsonl" 2; expect "the second Slurm job trains" $?
w="$(workers_under "$JOB" | tr '\n' ' ')"
[ "$(echo $w | wc -w)" -eq 2 ]; expect "two workers under the batch script ($w)" $?
kill -TERM "$JOB" $w
slurm_stopped cancel "scancel"

finish
