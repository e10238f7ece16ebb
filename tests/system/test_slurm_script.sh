#!/usr/bin/env bash
# deploy/slurm/grpo.sbatch end to end with real workers, on this machine: stand-ins for Slurm's scontrol
# (the allocation is this host) and srun (the one-task step runs its command; the worker step becomes
# mpirun -np SLURM_NTASKS) run the script unchanged. grpod starts on tcp with a per-job secret, a trainer
# and a rollout rank (the split from the run's YAML) register, train over the tcp data plane, and finish.
# usage: test_slurm_script.sh (the script of this source tree; the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-slurm
src="$SRC_ROOT"
mkdir -p "$TMP/bin"
for p in grpod grpoctl grpo-worker; do ln -s "$(prog "$p")" "$TMP/bin/$p"; done
cat >"$TMP/bin/scontrol" <<'SH'
#!/bin/sh
# scontrol show hostnames LIST: this host
[ "$1 $2" = "show hostnames" ] && { echo 127.0.0.1; exit 0; }
exit 1
SH
cat >"$TMP/bin/srun" <<'SH'
#!/bin/sh
# srun [options] CMD...: with --ntasks=1 run CMD here; otherwise mpirun -np $SLURM_NTASKS CMD
one=0
while [ $# -gt 0 ]; do
    case "$1" in --ntasks=1) one=1; shift ;; --*) shift ;; *) break ;; esac
done
[ $one -eq 1 ] && exec "$@"
exec mpirun --oversubscribe --bind-to none -np "$SLURM_NTASKS" "$@"
SH
chmod +x "$TMP/bin/scontrol" "$TMP/bin/srun"
. "$(dirname "$0")/tiny_split.sh"
tiny_split "$TMP"
expect "tiny model and split run configuration" $?
port=$(( 10000 + RANDOM % 20000 )) # below the ephemeral ports (32768-60999): no outgoing connection holds it
( cd "$TMP" && PATH="$TMP/bin:$PATH" SLURM_JOB_NODELIST=localhost SLURM_JOB_ID=4242 SLURM_NTASKS=2 \
    GRPOD_PORT=$port GRPOD_HTTP=127.0.0.1:0 GRPO_RUN_DIR="$TMP/job" OPENBLAS_NUM_THREADS=1 \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout "$(scaled 120)" bash "$src/deploy/slurm/grpo.sbatch" "$TMP/split.yaml" >"$TMP/job.log" 2>&1 )
expect "grpo.sbatch runs to the end" $?
[ "$(stat -c %a "$TMP/job/secret" 2>/dev/null)" = 600 ]; expect "the job's secret is private (0600)" $?
grep -q "registered with grpod at tcp://127.0.0.1:$port: role trainer" "$TMP/job.log"; expect "rank 0 registered as trainer over tcp" $?
grep -q "role rollout" "$TMP/job.log"; expect "rank 1 registered as rollout" $?
grep -q "pulling rollouts at tcp://\*:$((port + 1))" "$TMP/job.log"; expect "the data plane runs over tcp" $?
[ -f "$TMP/runs/p/e/checkpoints/global_step_3/actor/model.safetensors" ]; expect "the trainer wrote the final checkpoint" $?
grep -q "run finished at step 3" "$TMP/job.log"; expect "the run finished" $?
# the stand-in srun is mpirun without orte_enable_recovery: rank 0 warns (a real srun does not: slurm-real)
grep -q "mpirun ends the whole job when any rank dies" "$TMP/job.log"; expect "under mpirun, the recovery warning" $?
finish "$TMP/job.log"
