#!/usr/bin/env bash
# A lost NCCL peer never hangs the run: with a 2 s deadline, rank 0's all-reduce without rank 1 ends the job
# within seconds, naming the collective, the group size and the rank. Skipped (77) with fewer than 2 GPUs.
# usage: test_nccl_deadline.sh (the build's test_gpu_kernels by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-nccl-deadline
bin="$(prog gpu-kernels)"
"$bin" --probe 2 >/dev/null 2>&1
[ $? -eq 77 ] && { echo "fewer than 2 CUDA devices visible (NCCL needs one per rank): skipped"; exit 77; }
out="$TMP/out.log"
start=$(date +%s)
timeout "$(scaled 60)" mpirun --oversubscribe -np 2 "$bin" --nccl-deadline >"$out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
cat "$out"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -lt 30 ] &&
    grep -q "NCCL all-reduce over 2 ranks (this is rank 0) did not complete after" "$out" &&
    ! grep -q "returned without its peer" "$out"
expect "a lost NCCL peer ends the all-reduce within seconds, named (exit $rc after ${took}s)" $?
finish
