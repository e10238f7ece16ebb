#!/usr/bin/env bash
# grpoctl diagnose names a hang (proto/hang.c; docs/operations.md, "A run that hangs") on 2 colocated ranks under
# grpod, each hang made for real with the test-only keys test.block_at, test.block_rank and test.block_step (a rank
# blocks for ever at that point):
#  - laggard: rank 1 blocks entering the update of step 2; rank 0 waits in a collective for it. The verdict names
#    rank 1, the collective rank 0 waits in (its number in its group) and rank 1's phase; paused then, the run's
#    pause waits for both: its verdict comes first, naming both ranks and where each is, the laggard after it;
#  - I/O: rank 0 blocks inside the checkpoint write of step 2; the verdict names rank 0, the write, its step and its
#    path;
#  - never registered: rank 1 blocks before registering; the verdict names rank 1 and its host;
#  - grant starvation: in a split run (1 trainer, 1 rollout rank) the trainer blocks in its update of step 3; the
#    verdict names the rollout rank waiting for a work grant and where the trainer is;
#  - the watchdog with trainer.hang_action=stop under grpod: the job ends non-zero and grpod's run fails with the
#    watchdog's verdict as rank 0's reason.
# Each verdict is the first finding of grpoctl diagnose (text and --json) and of the status page's /api/status, and
# comes once the wait has lasted grpod.hang_wait_s.
# The mismatch and stuck verdicts: test_hang_collective.sh.
# usage: test_hang.sh (the build's programs by name, tests/lib.sh; the run and the checks: hang_lib.sh)
set -u
. "$(dirname "$0")/hang_lib.sh"
test_env
tiny_model "$TMP/tiny"
expect "tiny model initialised" $?
HOST="$(hostname)"

# ---- laggard: rank 1 never enters the update of step 2
hang laggard test.block_at=update_actor test.block_rank=1 test.block_step=2
wait_for 120 has "$TMP/laggard.log" "test.block_at: rank 1 blocks here for ever (step 2)"
expect "laggard: rank 1 blocks in the update of step 2" $?
saw_verdict hang_laggard
expect "laggard: grpoctl diagnose's first finding is hang_laggard" $?
text="$(jq -r '.[0].text' "$TMP/diag.json")"
echo "     | $text"
echo "$text" | grep -Eq "^rank 1 \(host $HOST\) has not entered [a-z() -]+ #[0-9]+ of [a-z]+ \(rank 0 waiting there [0-9]+ s\); rank 1 is in phase update_actor, in no wait"
expect "laggard: it names rank 1, the numbered collective rank 0 waits in, and rank 1's phase" $?
# the collective named is the one rank 0's heartbeat says it is in
op="$(status_field '.workers[] | select(.rank == 0) | .current_wait | "\(.op) #\(.seq) of \(.group)"')"
echo "$text" | grep -qF "has not entered $op (rank 0"
expect "laggard: ... the very wait rank 0 reports ($op)" $?
[ "$(echo "$text" | sed -E 's/.*waiting there ([0-9]+) s.*/\1/')" -ge 3 ]
expect "laggard: the verdict came once the wait had lasted grpod.hang_wait_s (3 s)" $?
same_on_page
expect "laggard: the status page's /api/status and grpoctl diagnose's text say the same" $?
"$GRPOCTL" metrics >"$TMP/metrics.txt" 2>&1 && has "$TMP/metrics.txt" 'grpod_run_hang{kind="laggard"} 1' &&
    has "$TMP/metrics.txt" 'grpod_run_hang{kind="io"} 0'
expect "laggard: grpod's metrics say grpod_run_hang{kind=\"laggard\"} 1, and 0 for io" $?
# paused now, the run cannot reach its safe point: the pause's wait comes first, naming both ranks and where each is,
# and the laggard behind it follows
"$GRPOCTL" pause >/dev/null 2>&1; expect "laggard: grpoctl pause is taken" $?
saw_verdict hang_pause
expect "laggard + pause: grpoctl diagnose's first finding is hang_pause" $?
text="$(jq -r '.[0].text' "$TMP/diag.json")"
echo "     | $text"
echo "$text" | grep -Eq "^the pause has waited [0-9]+ s for ranks 0-1 to reach a safe point: rank 0 \(host $HOST\) is in [a-z() -]+ #[0-9]+ of [a-z]+ \(ranks 0-1\).*, waiting [0-9]+ s; rank 1 \(host $HOST\) is in phase update_actor, in no wait$"
expect "laggard + pause: it names both ranks, the collective rank 0 waits in and rank 1's phase" $?
[ "$(jq -r '.[1].kind' "$TMP/diag.json")" = hang_laggard ] && [ "$(jq -r '.[0].knob' "$TMP/diag.json" | grep -c 'grpoctl resume')" = 1 ]
expect "laggard + pause: the laggard follows it, and its knob says how to give the pause up" $?
same_on_page
expect "laggard + pause: the status page's /api/status and grpoctl diagnose's text say the same" $?
"$GRPOCTL" metrics >"$TMP/metrics.txt" 2>&1 && has "$TMP/metrics.txt" 'grpod_run_hang{kind="pause"} 1'
expect "laggard + pause: grpod's metrics say grpod_run_hang{kind=\"pause\"} 1" $?
kill_tree "$MPI_PID"
stop_grpod

# ---- I/O: rank 0 stuck inside the checkpoint write of step 2
hang io test.block_at=checkpoint_write test.block_rank=0 test.block_step=2 trainer.save_freq=2
wait_for 120 has "$TMP/io.log" "test.block_at: rank 0 blocks here for ever (step 2)"
expect "io: rank 0 blocks in the checkpoint write of step 2" $?
saw_verdict hang_io
expect "io: grpoctl diagnose's first finding is hang_io" $?
text="$(jq -r '.[0].text' "$TMP/diag.json")"
echo "     | $text"
echo "$text" | grep -Eq "^rank 0 \(host $HOST\) is stuck in I/O: checkpoint write of step 2 in $TMP/io/p/e[^,]*, [0-9]+ s so far"
expect "io: it names rank 0, the checkpoint write of step 2 and its path" $?
same_on_page
expect "io: the status page's /api/status and grpoctl diagnose's text say the same" $?
kill_tree "$MPI_PID"
stop_grpod

# ---- never registered: rank 1 blocks before it registers
hang unregistered test.block_at=register test.block_rank=1
wait_for 120 has "$TMP/unregistered.log" "test.block_at: rank 1 blocks here for ever (step 0)"
expect "unregistered: rank 1 blocks before registering" $?
saw_verdict hang_unregistered
expect "unregistered: grpoctl diagnose's first finding is hang_unregistered" $?
text="$(jq -r '.[0].text' "$TMP/diag.json")"
echo "     | $text"
echo "$text" | grep -Eq "^start-up waits for rank 1 \(host $HOST\), which never registered: 1 rank\(s\) registered"
expect "unregistered: it names rank 1 and its host" $?
same_on_page
expect "unregistered: the status page's /api/status and grpoctl diagnose's text say the same" $?
kill_tree "$MPI_PID"
stop_grpod

# ---- grant starvation: a split run (1 trainer, 1 rollout rank), the trainer blocked in the update of step 3: the
# rollout rank's ask for its next unit is never granted. (Step 3, not 2: grpod counts a wait as a hang once it is
# longer than 3 steps of the last step's time, and a split run's step 1 includes the rollout rank's start-up, which
# on a loaded machine under the sanitizers can be long.)
LAYOUT="placement.trainer_ranks=1 placement.rollout_ranks=1" hang grant test.block_at=update_actor \
    test.block_rank=0 test.block_step=3
wait_for 120 has "$TMP/grant.log" "test.block_at: rank 0 blocks here for ever (step 3)"
expect "grant: the trainer blocks in the update of step 3" $?
saw_verdict hang_grant
expect "grant: grpoctl diagnose's first finding is hang_grant" $?
text="$(jq -r '.[0].text' "$TMP/diag.json")"
echo "     | $text"
echo "$text" | grep -Eq "^rollout rank 1 has waited [0-9]+ s for a work grant that does not come \(work request to dispatcher at [^)]+\): the dispatcher grants no unit; the trainers: rank 0 is in phase update_actor, in no wait"
expect "grant: it names the rollout rank, its request to the dispatcher, and where the trainer is" $?
same_on_page
expect "grant: the status page's /api/status and grpoctl diagnose's text say the same" $?
kill_tree "$MPI_PID"
stop_grpod

# ---- the watchdog under grpod (trainer.hang_action=stop): the job ends, and grpod hears why from rank 0
hang stopped test.block_at=update_actor test.block_rank=1 test.block_step=2 trainer.hang_timeout_s="$(scaled 4)" \
    trainer.hang_action=stop
timeout "$(scaled 120)" tail --pid="$MPI_PID" -f /dev/null
ended=$?
wait "$MPI_PID"
status=$?
[ "$ended" -eq 0 ] && [ "$status" -ne 0 ]
expect "stopped: the watchdog ends the job by itself, non-zero ($status)" $?
failed_why() {
    "$GRPOCTL" status --json >"$TMP/stopped.json" 2>/dev/null &&
        jq -e --arg h "$HOST" '.state == "failed" and (.events | any(.text |
            startswith("rank 0 on host \($h) failed: watchdog: no step completed for ") and
            contains("(trainer.hang_timeout_s): rank 1 (host \($h)) has not entered ")))' \
            "$TMP/stopped.json" >/dev/null
}
wait_for 30 failed_why
expect "stopped: grpod's run failed, its event naming the watchdog's verdict: rank 1" $?
jq -r '.events[] | select(.text | test("watchdog")) | .text' "$TMP/stopped.json" | sed 's/^/     | /'
stop_grpod
finish "$TMP/laggard.log" "$TMP/io.log" "$TMP/unregistered.log" "$TMP/grant.log" "$TMP/stopped.log"
