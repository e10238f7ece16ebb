#!/usr/bin/env bash
# The flight recorder (worker/flight; docs/operations.md, "Flight recorder") on 2 colocated ranks under grpod and
# mpirun, the run paused:
#  - the heartbeats carry each rank's wait under way and its last ones: grpoctl workers --json shows rank 1 held in
#    the leader's broadcast of the trainers group (root 0), its wait growing;
#  - grpoctl trace 1 prints rank 1's ring: all-reduces of the dp group with their number in the group and bytes,
#    then the wait under way; the same numbers on rank 0 are the same collectives (the same operation and bytes);
#  - SIGUSR2 to rank 0 writes RUN_DIR/flight/rank-0.jsonl and a line per record in its log;
#  - grpoctl stacks prints each rank's native stack, naming functions of ours (trainer_run, main), and grpoctl
#    stacks 1 rank 1's alone;
#  - resumed and stopped, the run ends cleanly.
# usage: test_flight.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/grpod_lib.sh"
test_env
tiny_model "$TMP/tiny"
expect "tiny model initialised" $?
tiny_run KEYS "$TMP/out" 400
RUN_DIR="$TMP/out/p/e"

start_grpod g1 # no run keys: the first rank's configuration defines the run
expect "grpod answers" $?
mpirun --oversubscribe --bind-to none -np 2 "$WORKER" "${KEYS[@]}" trainer.nnodes=1 trainer.n_gpus_per_node=2 \
    trainer.save_freq=-1 grpod.endpoint="$EP" grpod.connect_timeout_s=20 >>"$TMP/run.log" 2>&1 &
MPI_PID=$!
track "$MPI_PID"
wait_for 120 step_at_least 3
expect "both ranks register and train" $?
"$GRPOCTL" pause --wait="$(scaled 60)" >"$TMP/pause.out" 2>&1
expect "the run pauses" $?

# ---- the heartbeat's current wait: rank 1 waits for the leader's word at the safe point, a broadcast from root 0
held() {
    "$GRPOCTL" workers --json >"$TMP/workers.json" 2>/dev/null &&
        jq -e '.[] | select(.rank == 1) | .current_wait | .op == "broadcast" and .group == "trainers" and
               .members == "0-1" and .peer == 0 and .open and .seconds >= 1' "$TMP/workers.json" >/dev/null
}
wait_for 30 held
expect "grpoctl workers --json: rank 1's current wait is the trainers' broadcast from root 0, a second and more" $?
jq -e '.[] | select(.rank == 1) | .recent_waits | length >= 1 and all(.[]; .open == false and .seq > 0)' \
    "$TMP/workers.json" >/dev/null
expect "... and its last finished waits came with it" $?
"$GRPOCTL" workers >"$TMP/workers.txt" 2>&1
grep -Eq "in broadcast #[0-9]+ of trainers \(ranks 0-1\) from root 0, 4 B, waiting [0-9.]+ s so far" "$TMP/workers.txt"
expect "grpoctl workers names the wait of the held rank" $?

# ---- grpoctl trace: the whole ring of rank 1, then of rank 0
"$GRPOCTL" trace 1 >"$TMP/trace1.txt" 2>&1
expect "grpoctl trace 1" $?
grep -Eq "^rank 1 \(host .*, pid [0-9]+, paused\): the last [0-9]+ waits of its flight recorder" "$TMP/trace1.txt"
expect "the trace says whose it is" $?
[ "$(grep -Ec "^  #[0-9]+ +[0-9:.]+Z  all-reduce #[0-9]+ of dp \(ranks 0-1\), [0-9.]+ (B|KiB|MiB)," "$TMP/trace1.txt")" -ge 3 ]
expect "recent all-reduces of the dp group, each with its number in the group and its bytes" $?
grep -Eq "^  now .* broadcast #[0-9]+ of trainers \(ranks 0-1\) from root 0, 4 B, waiting" "$TMP/trace1.txt"
expect "the wait under way last" $?
"$GRPOCTL" trace 1 --json >"$TMP/trace1.json" 2>&1 && "$GRPOCTL" trace 0 --json >"$TMP/trace0.json" 2>&1
expect "grpoctl trace --json, ranks 1 and 0" $?
# a collective is the same numbered operation on both ranks: the dp group's numbers both traces hold agree
jq -s -e '[.[0].entries[], .[1].entries[]] | map(select(.group == "dp" and .open == false)) | group_by(.seq) |
          map(select(length == 2)) | length >= 3 and all(.[]; .[0].op == .[1].op and .[0].bytes == .[1].bytes)' \
    "$TMP/trace0.json" "$TMP/trace1.json" >/dev/null
expect "the dp group's operation #N is the same all-reduce (op and bytes) on rank 0 and rank 1" $?
has "$RUN_DIR/flight/rank-1.jsonl" '"reason":"grpoctl trace"'
expect "grpoctl trace also wrote the ring to RUN_DIR/flight/rank-1.jsonl" $?

# ---- SIGUSR2: the dump in the run directory and the log
pid0="$(status_field '.workers[] | select(.rank == 0) | .pid')"
kill -USR2 "$pid0"
expect "SIGUSR2 sent to rank 0 (pid $pid0)" $?
dumped() { has "$TMP/run.log" "[rank 0] flight: SIGUSR2: the ring is in $RUN_DIR/flight/rank-0.jsonl"; }
wait_for 30 dumped
expect "rank 0 says where its dump is" $?
head -n 1 "$RUN_DIR/flight/rank-0.jsonl" | jq -e '.rank == 0 and .reason == "SIGUSR2" and .entries >= 3' >/dev/null &&
    [ "$(tail -n +2 "$RUN_DIR/flight/rank-0.jsonl" | jq -c 'select(.op == "all-reduce" and .group == "dp")' | wc -l)" -ge 3 ]
expect "RUN_DIR/flight/rank-0.jsonl: the header, then all-reduces of dp as JSON lines" $?
[ "$(grep -Ec "\[rank 0\] flight: #[0-9]+ all-reduce #[0-9]+ of dp \(ranks 0-1\)" "$TMP/run.log")" -ge 3 ]
expect "... and a line per record in rank 0's log" $?
stacked() { grep -q "\[rank 0\] flight:   .*grpo-worker(main+" "$TMP/run.log"; }
wait_for 30 stacked
expect "... and its main thread's stack after them" $?
kill -0 "$pid0"
expect "rank 0 lives on after SIGUSR2" $?

# ---- grpoctl stacks: every rank's native stack, then one rank's
"$GRPOCTL" stacks >"$TMP/stacks.txt" 2>&1
expect "grpoctl stacks" $?
grep -q "^==== rank 0 (host .*): the main thread's stack" "$TMP/stacks.txt" &&
    grep -q "^==== rank 1 (host .*): the main thread's stack" "$TMP/stacks.txt"
expect "a stack for each rank" $?
[ "$(grep -c "grpo-worker(trainer_run+" "$TMP/stacks.txt")" -eq 2 ] &&
    [ "$(grep -c "grpo-worker(main+" "$TMP/stacks.txt")" -eq 2 ]
expect "each names functions of ours (trainer_run, main)" $?
grep -q "grpo-worker(control_wait_resume+" "$TMP/stacks.txt" && grep -q "grpo-worker(comm_broadcast_polled+" "$TMP/stacks.txt"
expect "the leader holds in control_wait_resume, rank 1 in comm_broadcast_polled" $?
"$GRPOCTL" stacks 1 >"$TMP/stacks1.txt" 2>&1 && grep -q "^==== rank 1 " "$TMP/stacks1.txt" &&
    ! grep -q "^==== rank 0 " "$TMP/stacks1.txt"
expect "grpoctl stacks 1: rank 1's alone" $?
has "$RUN_DIR/flight/stacks-rank-1.txt" "grpo-worker(main+"
expect "the stack is in RUN_DIR/flight/stacks-rank-1.txt too" $?
"$GRPOCTL" trace 7 >"$TMP/trace7.out" 2>&1
[ $? -eq 1 ] && has "$TMP/trace7.out" "no rank 7 has registered"
expect "grpoctl trace of a rank that is not there: refused, saying so" $?

# ---- the run goes on and ends
"$GRPOCTL" resume >/dev/null 2>&1
expect "resume" $?
"$GRPOCTL" stop --wait="$(scaled 120)" >"$TMP/stop.out" 2>&1
expect "stop" $?
wait "$MPI_PID"
expect "both ranks exit 0" $?
stop_grpod
finish
