#!/usr/bin/env bash
# SIGTERM in split runs (2 trainer + 1 rollout ranks under mpirun, as Slurm signals them: every rank): trainer
# DP rank 0 stops the run at its next safe point after a checkpoint, the rollout rank ends when the trainers'
# dispatcher says so, every rank exits 0. A second signal ends a rank at once (here a trainer stuck waiting for a
# frozen rollout rank, so no safe point comes).
# usage: test_sigterm_split.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-sigterm
src="$SRC_ROOT" GRPOD="$(prog grpod)" GRPOCTL="$(prog grpoctl)" WORKER="$(prog grpo-worker)" MODEL_TOOL="$(prog grpo-model)"
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
tiny_run COMMON "$TMP" 100000 # (each run names its own trainer.default_local_dir)
COMMON+=(placement.trainer_ranks=2 placement.rollout_ranks=1)

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
sleep 1.2 # sleep-ok: a signal over a second after the first is what is tested (the same signal within a second of the first is the same request (coreutils timeout sends two))
kill -TERM "$r0"
wait_for 20 sh -c "! kill -0 $MP"; expect "the second SIGTERM ends the job at once" $?
wait "$MP"; rc=$?
[ "$rc" -ne 0 ]; expect "mpirun exits non-zero (got $rc)" $?
grep -q "\[rank 0\] worker: SIGTERM received after SIGTERM: ending now, without a checkpoint" "$TMP/t.log"
expect "rank 0 logs why it ends at once" $?

# deploy/slurm/grpo.sbatch's stop paths (the time limit's USR1, scancel --batch --signal=USR1, scancel,
# requeue) are tested under a real Slurm by tests/cluster/slurm/test_slurm_real.sh (a stand-in srun that execs
# mpirun cannot show what srun does with a SIGTERM).

finish
