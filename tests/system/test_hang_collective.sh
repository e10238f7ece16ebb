#!/usr/bin/env bash
# grpoctl diagnose's mismatch and stuck verdicts (proto/hang.c; docs/operations.md, "A run that hangs") made for real
# on 2 colocated ranks under grpod, with the test-only keys test.block_at, test.block_rank=1 and test.block_step=2:
#  - mismatch in one group (dp_barrier): entering the update of step 2, rank 1 enters a barrier of its DP group that
#    rank 0 never enters; rank 0 enters the update's first collective of dp. The verdict names the group, and each
#    rank with the collective and number it waits in, as their heartbeats report them. With blocking collectives
#    (actor_rollout_ref.nccl_timeout=0): with a deadline Open MPI starts both non-blocking, and its non-blocking
#    collectives of different kinds on one communicator match each other (the barrier meets the all-reduce and the
#    run ends on an MPI truncation error instead of hanging);
#  - mismatch across groups (trainers_barrier): rank 1 enters a barrier of the trainers' group instead, rank 0 waits
#    in dp's collective for it. The verdict names both waits, their groups and numbers;
#  - stuck (in_dp_collective): rank 1 enters the update's first collective of dp, as rank 0 does, and freezes inside
#    it: every rank of dp waits in the same collective. The verdict names the group and the collective's number.
# Each verdict is the first finding of grpoctl diagnose (text and --json), of the status page's /api/status and of
# grpod's metrics, and comes once the wait has lasted grpod.hang_wait_s (3 s); the workers' own watchdog
# (trainer.hang_timeout_s, hang_action wait) logs the same kind from the ranks' dumps. Then the test ends the job by
# its recorded pid, and every process of it is gone. The collectives' deadline (600 s where there is one) would end
# the job long after.
# usage: test_hang_collective.sh (the build's programs by name, tests/lib.sh; the run and the checks: hang_lib.sh)
set -u
. "$(dirname "$0")/hang_lib.sh"
test_env
tiny_model "$TMP/tiny"
expect "tiny model initialised" $?
# the workers' watchdog: a dump and a verdict soon after the hang, and the job left waiting
WATCH=(trainer.hang_timeout_s="$(scaled 4)" trainer.hang_action=wait)

# wait_of RANK: "OP #SEQ of GROUP", the wait rank RANK's heartbeat reports now
wait_of() { status_field ".workers[] | select(.rank == $1) | .current_wait | \"\(.op) #\(.seq) of \(.group)\""; }
# metric_is KIND: grpod's metrics count one hang of KIND, none of the other kinds (saved in $TMP/metrics.txt)
metric_is() {
    "$GRPOCTL" metrics >"$TMP/metrics.txt" 2>&1 || return 1
    local k
    for k in unregistered io mismatch laggard grant stuck; do
        has "$TMP/metrics.txt" "grpod_run_hang{kind=\"$k\"} $([ "$k" = "$1" ] && echo 1 || echo 0)" || return 1
    done
}
# running PID:START: the process PID started at START (lib.sh's started) still runs (a zombie has ended)
running() {
    [ "$(started "${1%:*}")" = "${1#*:}" ] && ! awk '{ sub(/.*\) /, ""); exit $1 != "Z" }' "/proc/${1%:*}/stat" 2>/dev/null
}
# none_running PID:START...: none of them runs
none_running() {
    local p
    for p in "$@"; do running "$p" && return 1; done
    return 0
}
# ended NAME: the job of hang NAME ended by its recorded pid (mpirun, and every process below it, gone)
ended() {
    local p procs=()
    for p in "$MPI_PID" $(descendants "$MPI_PID"); do procs+=("$p:$(started "$p")"); done
    kill_tree "$MPI_PID"
    [ "${#procs[@]}" -ge 3 ] && wait_for 30 none_running "${procs[@]}" # mpirun and its 2 ranks at least
    expect "$1: the test ends the job by its pid: its ${#procs[@]} processes are gone" $?
    stop_grpod
}

# ---- mismatch in one group: rank 1 in a barrier of dp, rank 0 in the update's first collective of dp
hang mismatch test.block_at=dp_barrier test.block_rank=1 test.block_step=2 actor_rollout_ref.nccl_timeout=0 "${WATCH[@]}"
wait_for 120 has "$TMP/mismatch.log" "test.block_at: rank 1 enters a barrier of its DP group that no other rank enters (step 2)"
expect "mismatch: rank 1 enters a barrier of dp entering the update of step 2" $?
saw_verdict hang_mismatch
expect "mismatch: grpoctl diagnose's first finding is hang_mismatch" $?
text="$(jq -r '.[0].text' "$TMP/diag.json")"
echo "     | $text"
echo "$text" | grep -Eq "^mismatch in dp \(ranks 0-1\): its ranks wait in different collectives, which never meet: rank 0 in [a-z() -]+ #[0-9]+, rank 1 in barrier #[0-9]+ \(up to [0-9]+ s\)$"
expect "mismatch: it names dp, rank 0 in its collective and rank 1 in the barrier, each with its number" $?
w0="$(wait_of 0)" w1="$(wait_of 1)"
[[ "$w0" == *" of dp" && "$w1" == "barrier #"*" of dp" && "${w0%% #*}" != barrier ]] &&
    echo "$text" | grep -qF "rank 0 in ${w0% of dp}, rank 1 in ${w1% of dp} ("
expect "mismatch: ... the very waits the ranks' heartbeats report ($w0; $w1)" $?
[ "$(echo "$text" | sed -E 's/.*\(up to ([0-9]+) s\)$/\1/')" -ge 3 ] 2>/dev/null
expect "mismatch: the verdict came once the wait had lasted grpod.hang_wait_s (3 s)" $?
same_on_page
expect "mismatch: the status page's /api/status and grpoctl diagnose's text say the same" $?
metric_is mismatch
expect "mismatch: grpod's metrics say grpod_run_hang{kind=\"mismatch\"} 1, 0 for the other kinds" $?
wait_for 60 has "$TMP/mismatch.log" "watchdog: hang (mismatch): mismatch in dp (ranks 0-1): its ranks wait in different collectives"
expect "mismatch: the workers' watchdog names the same mismatch from the ranks' dumps" $?
ended mismatch

# ---- mismatch across groups: rank 1 in a barrier of the trainers' group, rank 0 in dp's collective
hang across test.block_at=trainers_barrier test.block_rank=1 test.block_step=2 "${WATCH[@]}"
wait_for 120 has "$TMP/across.log" "test.block_at: rank 1 enters a barrier of the trainers' group that no other rank enters (step 2)"
expect "across: rank 1 enters a barrier of the trainers' group entering the update of step 2" $?
saw_verdict hang_mismatch
expect "across: grpoctl diagnose's first finding is hang_mismatch" $?
text="$(jq -r '.[0].text' "$TMP/diag.json")"
echo "     | $text"
echo "$text" | grep -Eq "^mismatch across groups: rank 1 waits in barrier #[0-9]+ of trainers \(ranks 0-1\) while rank 0 waits in [a-z() -]+ #[0-9]+ of dp \(ranks 0-1\): neither can go on \(up to [0-9]+ s\)$"
expect "across: it names rank 1 in the trainers' barrier and rank 0 in dp's collective, each with its number" $?
w0="$(wait_of 0)" w1="$(wait_of 1)"
echo "$text" | grep -qF "rank 1 waits in $w1 (ranks 0-1) while rank 0 waits in $w0 (ranks 0-1)"
expect "across: ... the very waits the ranks' heartbeats report ($w1; $w0)" $?
same_on_page
expect "across: the status page's /api/status and grpoctl diagnose's text say the same" $?
metric_is mismatch
expect "across: grpod's metrics say grpod_run_hang{kind=\"mismatch\"} 1, 0 for the other kinds" $?
wait_for 60 has "$TMP/across.log" "watchdog: hang (mismatch): mismatch across groups: rank 1 waits in barrier #"
expect "across: the workers' watchdog names the same mismatch from the ranks' dumps" $?
ended across

# ---- stuck: every rank of dp in the same collective, rank 1 frozen inside it
hang stuck test.block_at=in_dp_collective test.block_rank=1 test.block_step=2 "${WATCH[@]}"
wait_for 120 has "$TMP/stuck.log" "comm: test.block_at: this rank freezes for ever inside "
expect "stuck: rank 1 freezes inside a collective of dp in the update of step 2" $?
frozen="$(grep -m1 -o 'freezes for ever inside .* of dp (ranks 0-1)' "$TMP/stuck.log" | sed -E 's/^freezes for ever inside (.*) of dp \(ranks 0-1\)$/\1/')"
has "$TMP/stuck.log" "test.block_at: rank 1 freezes inside the update's first collective of its DP group (step 2)"
expect "stuck: ... the update's first collective of dp, of step 2 ($frozen)" $?
saw_verdict hang_stuck
expect "stuck: grpoctl diagnose's first finding is hang_stuck" $?
text="$(jq -r '.[0].text' "$TMP/diag.json")"
echo "     | $text"
echo "$text" | grep -Eq "^every rank of dp \(ranks 0-1\) has been in [a-z() -]+ #[0-9]+ for up to [0-9]+ s: the operation itself does not complete"
expect "stuck: it names dp and the numbered collective every rank waits in" $?
echo "$text" | grep -qF "has been in $frozen for up to" && [ "$(wait_of 0)" = "$frozen of dp" ] &&
    [ "$(wait_of 1)" = "$frozen of dp" ]
expect "stuck: ... the one rank 1 froze in, which both ranks' heartbeats report ($frozen)" $?
same_on_page
expect "stuck: the status page's /api/status and grpoctl diagnose's text say the same" $?
metric_is stuck
expect "stuck: grpod's metrics say grpod_run_hang{kind=\"stuck\"} 1, 0 for the other kinds" $?
wait_for 60 has "$TMP/stuck.log" "watchdog: hang (stuck): every rank of dp (ranks 0-1) has been in $frozen for up to"
expect "stuck: the workers' watchdog names the same stuck collective from the ranks' dumps" $?
ended stuck
finish "$TMP/mismatch.log" "$TMP/across.log" "$TMP/stuck.log"
