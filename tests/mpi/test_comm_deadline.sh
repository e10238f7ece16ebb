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
    timeout "$(scaled 60)" mpirun --oversubscribe -np 2 "$bin" --deadline 2 --stuck-peer "$op" >"$out" 2>&1
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
