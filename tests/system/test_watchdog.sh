#!/usr/bin/env bash
# The progress watchdog (worker/watchdog; docs/operations.md, "A run that hangs") on 2 colocated ranks without
# grpod, rank 1 blocked for ever entering the update of step 3 (test.block_at=update_actor, test.block_rank=1,
# test.block_step=3) and trainer.hang_timeout_s=5 (times the tests' time scale):
#  - stop (trainer.hang_action=stop, a checkpoint every step): both ranks dump their flight recorder and native stack
#    into RUN_DIR/flight; rank 0's log names the stuck rank (rank 1, in phase update_actor) and the collective rank 0
#    waits in; the job ends with a non-zero status, its last word naming the newest checkpoint already written (step
#    2), which is on disk;
#  - wait (the default action): the same dumps and verdict, then the job waits on (alive after the line that says
#    so); the test ends it.
# usage: test_watchdog.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" watchdog-test
test_env
tiny_model "$TMP/tiny"
expect "tiny model initialised" $?
HT="$(scaled 5)" # trainer.hang_timeout_s: many tiny steps' time, on a loaded machine too

# run NAME [key=value ...]: 2 colocated ranks, rank 1 blocked in the update of step 3, the watchdog at 5 s; in the
# background (MPI_PID), log $TMP/NAME.log, run directory $TMP/NAME/p/e
run() {
    local name="$1"; shift
    local keys
    tiny_run keys "$TMP/$name" 50
    mpirun --oversubscribe --bind-to none -np 2 "$WORKER" "${keys[@]}" trainer.nnodes=1 trainer.n_gpus_per_node=2 \
        test.block_at=update_actor test.block_rank=1 test.block_step=3 trainer.hang_timeout_s="$HT" "$@" \
        >"$TMP/$name.log" 2>&1 &
    MPI_PID=$!
    track "$MPI_PID"
}
# dumped NAME: both ranks' dumps of a stall and their stacks are in NAME's run directory
dumped() {
    local d="$TMP/$1/p/e/flight" r
    for r in 0 1; do
        head -n 1 "$d/rank-$r.jsonl" 2>/dev/null | jq -e '.reason | startswith("watchdog: no step completed for")' \
            >/dev/null && grep -q "grpo-worker(main+" "$d/stacks-rank-$r.txt" 2>/dev/null || return 1
    done
}
# named NAME: rank 0's log names rank 1 as the laggard, and the collective rank 0 waits in
named() {
    grep -Eq "\[rank 0\] watchdog: hang \(laggard\): rank 1 \(host $(hostname)\) has not entered [a-z() -]+ #[0-9]+ of [a-z]+ \(rank 0 waiting there [0-9]+ s\); rank 1 is in phase update_actor, in no wait" \
        "$TMP/$1.log"
}

# ---- stop
run stop trainer.hang_action=stop trainer.save_freq=1
timeout "$(scaled 180)" tail --pid="$MPI_PID" -f /dev/null
ended=$?
wait "$MPI_PID"
status=$?
[ "$ended" -eq 0 ] && [ "$status" -ne 0 ]
expect "stop: the job ends by itself, with a non-zero status ($status)" $?
has "$TMP/stop.log" "test.block_at: rank 1 blocks here for ever (step 3)"
expect "stop: rank 1 blocked in the update of step 3" $?
grep -Eq "\[rank 0\] watchdog: no step completed for [0-9]+ s \(trainer.hang_timeout_s $HT s\): rank 0 is in [a-z() -]+ #[0-9]+ of" "$TMP/stop.log" &&
    grep -Eq "\[rank 1\] watchdog: no step completed for [0-9]+ s \(trainer.hang_timeout_s $HT s\): rank 1 is in no wait" "$TMP/stop.log"
expect "stop: each rank says where it is" $?
dumped stop
expect "stop: both ranks' flight recorders and stacks are in RUN_DIR/flight" $?
named stop
expect "stop: rank 0's log names the stuck rank, rank 1, and the collective it never entered" $?
grep "watchdog: hang (laggard)" "$TMP/stop.log" | sed 's/^/     | /'
ckpt="$TMP/stop/p/e/checkpoints"
grep -Eq "\[rank 0\] watchdog: trainer.hang_action stop: ending the job, exit status 3: rank 1 \(host $(hostname)\) has not entered .*; the newest checkpoint already written is step 2 in $ckpt/global_step_2 " "$TMP/stop.log"
expect "stop: the last word names the stuck rank and the newest checkpoint, step 2" $?
[ -f "$ckpt/global_step_2/state.json" ] && [ ! -e "$ckpt/global_step_3" ]
expect "stop: the checkpoint of step 2 is on disk, none of step 3" $?

# ---- wait
run wait
wait_for 120 has "$TMP/wait.log" "[rank 0] watchdog: trainer.hang_action wait: waiting on"
expect "wait: rank 0 says it waits on" $?
dumped wait
expect "wait: both ranks' flight recorders and stacks are in RUN_DIR/flight" $?
named wait
expect "wait: rank 0's log names the stuck rank, rank 1" $?
kill -0 "$MPI_PID" 2>/dev/null && ! has "$TMP/wait.log" "ending the job"
expect "wait: the job is still there after the watchdog's word" $?
kill_tree "$MPI_PID"
finish "$TMP/stop.log" "$TMP/wait.log"
