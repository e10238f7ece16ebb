#!/usr/bin/env bash
# ULFM end to end (tests/ft/test_ulfm.c) under scripts/mpirun_ft -np 3: rank 2 SIGKILLs itself in the middle of an
# all-reduce; each survivor's all-reduce fails (MPI_ERR_PROC_FAILED, or MPI_ERR_REVOKED once the other has revoked)
# within 30 s, they revoke, shrink the world to 2 ranks, name rank 2 as the one lost, agree (MPIX_Comm_agree) and
# all-reduce on the shrunk communicator (sum 0 + 1); mpirun exits 0. The same program under Open MPI 5's mpirun
# without --with-ft ulfm: fault tolerance is off (the MPIX_FT attribute) and the job fails, so the flag is what
# turns ULFM on. mpirun_ft refuses a program of a build against Debian's MPI, naming the libmpi it would load.
# Skipped (77) without Open MPI 5 (scripts/ompi5_env.sh --no-install; scripts/test.sh installs it before the tests).
# The program: this build's in a build against Open MPI 5 (-Dmpi_prefix, build-ft), else compiled here with Open MPI
# 5's mpicc (it needs nothing of the project's).
set -u
. "$(dirname "$0")/../lib.sh" grpo-ft-ulfm
if ! prefix="$("$SRC_ROOT/scripts/ompi5_env.sh" --no-install 2>"$TMP/env.err")"; then
    cat "$TMP/env.err"
    echo "SKIP: no Open MPI 5 with ULFM here (scripts/ompi5_env.sh installs it; scripts/test.sh does before the tests)"
    exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# loads_ours PROGRAM: PROGRAM loads Open MPI 5's libmpi (the dynamic linker says which, as at launch)
loads_ours() {
    local lib
    lib="$(ldd "$1" 2>/dev/null | awk '$1 ~ /^libmpi\.so/ { print $3 }')"
    [ -n "$lib" ] && [[ "$(realpath -m "$lib")" == "$(realpath -m "$prefix")"/* ]]
}
bin="$(prog ft-ulfm 2>/dev/null)"
if [ ! -x "$bin" ] || ! loads_ours "$bin"; then
    bin="$TMP/test_ulfm"
    "$prefix/bin/mpicc" -std=c11 -O1 -Wall -Wextra -Werror -o "$bin" "$SRC_ROOT/tests/ft/test_ulfm.c" \
        >"$TMP/cc.log" 2>&1
    expect "test_ulfm.c compiles with Open MPI 5's mpicc ($prefix/bin/mpicc)" $?
    [ "$fails" -eq 0 ] || finish
fi
log="$TMP/ft.log"
start=$(date +%s)
timeout "$(scaled 120)" "$SRC_ROOT/scripts/mpirun_ft" --oversubscribe -np 3 "$bin" --bound "$(scaled 30)" >"$log" 2>&1
rc=$?
took=$(($(date +%s) - start))
expect "mpirun_ft -np 3: the job survives its lost rank and exits 0 (exit $rc after ${took} s)" $rc
says "$log" "rank 2: SIGKILL to itself in the middle of the all-reduce"
expect "rank 2 killed itself in the middle of an all-reduce" $?
! grep -q "^FAIL" "$log"
expect "no check of any rank failed" $?
for r in 0 1; do
    grep -Eq "^ok   rank $r: the all-reduce with the lost rank fails: MPI_ERR_(PROC_FAILED|REVOKED) after" "$log"
    expect "survivor $r: its all-reduce fails with MPI_ERR_PROC_FAILED or MPI_ERR_REVOKED within the bound" $?
    says "$log" "ok   rank $r: MPIX_Comm_shrink: 2 ranks, this one rank $r of them"
    expect "survivor $r: the shrunk communicator has 2 ranks" $?
    says "$log" "ok   rank $r: the acknowledged failures name the lost rank: 1 failed, world rank 2"
    expect "survivor $r: the acknowledged failure is world rank 2" $?
    says "$log" "ok   rank $r: MPIX_Comm_agree on the shrunk communicator: 0xfc (want 0xfc)"
    expect "survivor $r: MPIX_Comm_agree gives the AND of both flags" $?
    says "$log" "ok   rank $r: MPI_Allreduce on the shrunk communicator: sum 1 (want 1)"
    expect "survivor $r: the all-reduce on the shrunk communicator sums 0 + 1" $?
    says "$log" "rank $r: survived the lost rank"
    expect "survivor $r: reached MPI_Finalize" $?
done
# the failure is seen by a survivor first as itself (a revoke follows a seen failure)
grep -q "the all-reduce with the lost rank fails: MPI_ERR_PROC_FAILED" "$log"
expect "a survivor saw MPI_ERR_PROC_FAILED" $?

# without --with-ft ulfm: fault tolerance off, the job fails with its lost rank
log2="$TMP/noft.log"
OPAL_PREFIX="$prefix" timeout "$(scaled 120)" "$prefix/bin/mpirun" --oversubscribe -np 3 "$bin" >"$log2" 2>&1
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]
expect "without --with-ft ulfm the job fails (exit $rc)" $?
says "$log2" "FAIL rank 0: the launch enabled fault tolerance (MPIX_FT attribute of MPI_COMM_WORLD)"
expect "without --with-ft ulfm the MPIX_FT attribute is off" $?

# a program of a build against Debian's MPI: refused, naming the library it would load
worker="$(prog grpo-worker 2>/dev/null)"
if [ -x "$worker" ] && ldd "$worker" 2>/dev/null | grep -q "^[[:space:]]*libmpi\.so" && ! loads_ours "$worker"; then
    "$SRC_ROOT/scripts/mpirun_ft" -np 1 "$worker" --selftest >"$TMP/refused.log" 2>&1
    rc=$?
    [ "$rc" -eq 2 ] && has "$TMP/refused.log" "it was built against another MPI"
    expect "mpirun_ft refuses this build's Debian-MPI grpo-worker (exit $rc), naming its libmpi" $?
fi
finish
