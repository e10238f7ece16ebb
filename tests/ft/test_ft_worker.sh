#!/usr/bin/env bash
# A build against Open MPI 5 with ULFM (-Dmpi_prefix, build-ft): scripts/mpirun_ft runs the bare name grpo-worker as
# this build's (GRPO_FT_BUILD), which starts, passes its collective selftest on 2 ranks and says once, at start,
# that the launch turned ULFM on; launched by Open MPI 5's mpirun without --with-ft ulfm it says that it is off.
# Skipped (77) without Open MPI 5 (scripts/ompi5_env.sh --no-install).
set -u
. "$(dirname "$0")/../lib.sh" grpo-ft-worker
if ! prefix="$("$SRC_ROOT/scripts/ompi5_env.sh" --no-install 2>"$TMP/env.err")"; then
    cat "$TMP/env.err"
    echo "SKIP: no Open MPI 5 with ULFM here (scripts/ompi5_env.sh installs it)"
    exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 GRPO_FT_BUILD="$BUILD_ROOT"
log="$TMP/worker.log"
timeout "$(scaled 120)" "$SRC_ROOT/scripts/mpirun_ft" --oversubscribe -np 2 grpo-worker --selftest >"$log" 2>&1
expect "mpirun_ft -np 2 grpo-worker --selftest exits 0" $?
says "$log" "collective plane OK: 2 ranks"
expect "the selftest passes on Open MPI 5" $?
[ "$(lines_with "$log" "with ULFM, fault tolerance on (mpirun --with-ft ulfm): trainer-loss survival is available")" -eq 1 ]
expect "rank 0 says once that the launch turned ULFM on" $?
says "$log" "MPI: Open MPI v5."
expect "the line names the library that runs (Open MPI 5)" $?

log2="$TMP/noft.log"
OPAL_PREFIX="$prefix" timeout "$(scaled 120)" "$prefix/bin/mpirun" --oversubscribe -np 2 "$(prog grpo-worker)" \
    --selftest >"$log2" 2>&1
expect "Open MPI 5's mpirun without --with-ft: the worker runs (exit 0)" $?
says "$log2" "but this launch did not turn its fault tolerance on (scripts/mpirun_ft, or mpirun --with-ft ulfm)"
expect "without --with-ft ulfm the worker says fault tolerance is off" $?
finish
