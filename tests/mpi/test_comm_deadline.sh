#!/usr/bin/env bash
# A stuck MPI peer never hangs the run (actor_rollout_ref.nccl_timeout on the CPU's MPI groups): with a 2 s
# deadline, rank 0's all-reduce, its non-blocking all-reduce (a gradient bucket's wait), and then its receive,
# from a rank that sleeps end the job within seconds, naming the operation, the group size and the rank; without a deadline nothing is bounded (checked by the comm-* tests
# of every layout, which run both ways).
# usage: test_comm_deadline.sh (the build's test_comm by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-comm-deadline
bin="$(prog test-comm)"
out="$TMP/out.log"
for op in allreduce iallreduce recv; do
    start=$(date +%s)
    rm -rf "$TMP/flight"
    timeout "$(scaled 60)" mpirun --oversubscribe -np 2 "$bin" --deadline 2 --stuck-peer "$op" --flight-dir "$TMP/flight" \
        >"$out" 2>&1
    rc=$?
    took=$(($(date +%s) - start))
    case $op in allreduce) what="all-reduce" ;; iallreduce) what="all-reduce (a gradient bucket)" ;; recv) what="receive" ;; esac
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -lt 30 ]
    expect "a stuck peer ends the $op within seconds (exit $rc after ${took}s, the peer sleeps 60 s)" $?
    grep -q "MPI $what over 2 ranks (this is rank 0 of the group) did not complete after 2\.[0-9] s" "$out" &&
        grep -q "actor_rollout_ref.nccl_timeout = 2 s" "$out"
    expect "the error names the $what, the group size, the rank and the key" $?
    ! grep -q "returned without its peer" "$out"
    expect "the $op did not return" $?
    # the flight recorder's ring, dumped before the run ended: the three sums every rank made, then the stuck wait
    dump="$TMP/flight/rank-0.jsonl"
    case $op in allreduce) rec="all-reduce" ;; iallreduce) rec="all-reduce (bucket)" ;; recv) rec="receive" ;; esac
    head -n 1 "$dump" 2>/dev/null | grep -q "\"rank\":0,\"reason\":\"MPI $what over 2 ranks" &&
        [ "$(grep -c '"op":"all-reduce","group":"world","members":"0-1","group_size":2,"seq":[1-3],.*"open":false' "$dump")" -eq 3 ] &&
        grep -q "\"op\":\"$rec\",\"group\":\"world\".*\"open\":true" "$dump"
    expect "the deadline dumped rank 0's flight recorder first: 3 sums of world, then the $rec under way" $?
    grep -q "flight: under way: $rec #[0-9]* of world (ranks 0-1)" "$out" &&
        [ "$(grep -n "flight: under way" "$out" | head -1 | cut -d: -f1)" -lt "$(grep -n "ending the run" "$out" | head -1 | cut -d: -f1)" ]
    expect "... and logged it, the wait under way named, before the run ended" $?
    [ $fails -eq 0 ] || cat "$out"
done
# comm_try_broadcast (the weight broadcast's group): a late peer gives the group up at the deadline instead of
# ending the run, and the group is not used again
start=$(date +%s)
timeout "$(scaled 60)" mpirun --oversubscribe -np 3 "$bin" --deadline 2 --stuck-peer try_broadcast >"$out" 2>&1
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -eq 0 ] && [ "$took" -lt 30 ]
expect "try_broadcast: the job goes on and ends cleanly (exit $rc after ${took}s)" $?
[ "$(grep -c "gave up: rc -1 after 2\.[0-9] s; again: rc -1 after 0\.00[0-9] s" "$out")" -eq 2 ]
expect "each waiting rank gives up at the 2 s deadline, and at once the second time" $?
grep -q "MPI broadcast over 3 ranks (this is rank 0 of the group) did not complete after 2\.[0-9] s" "$out" &&
    grep -q "giving the group up" "$out"
expect "the log names the broadcast, the group and the rank" $?
finish
