#!/usr/bin/env bash
# deploy/slurm/grpo.sbatch under a real Slurm (slurm-wlm, munge): munged, slurmctld and slurmd for one node (this
# host) started by hand under $TMP, and the script submitted unchanged, its #SBATCH lines overridden on the sbatch
# command line for 2 CPU tasks on one node (1 trainer + 1 rollout rank of a tiny model, tests/system/tiny_split.sh).
#  - a clean job ends COMPLETED with exit code 0 (the job completion log), grpod and the workers on the ports the
#    job printed, and no rank warns about mpirun's options (srun launched them);
#  - two jobs run on the node at once, on different ports, one moved past a port something else listens on;
#  - the time limit: --time=2 --signal=B:USR1@100 (the script's own USR1 path, 100 s ahead): the workers write a
#    checkpoint and the job ends COMPLETED, exit 0;
#  - scancel --batch --signal=USR1: the same;
#  - scontrol requeue of the job that hit its time limit: it resumes from its checkpoint; then a plain scancel:
#    the workers checkpoint again, at a later step, before Slurm's KillWait runs out.
# Skipped (77) when not root (the daemons run as root) or Slurm is not installed (scripts/deps.sh installs it).
# usage: test_slurm_real.sh (the script of this source tree; the build's programs by name, tests/lib.sh)
set -u
if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: needs root (munged, slurmctld and slurmd run as root)"
    exit 77
fi
here="$(dirname "$0")"
. "$here/slurm_lib.sh"
missing="$(slurm_missing)"
if [ -n "$missing" ]; then
    echo "SKIP: $missing is not installed (scripts/deps.sh installs slurm-wlm and munge)"
    exit 77
fi
. "$here/../../lib.sh" grpo-slurm-real
. "$here/../../system/tiny_split.sh"
src="$SRC_ROOT"
chmod 755 "$TMP"
mkdir -p "$TMP/bin"
for p in grpod grpoctl grpo-worker; do ln -s "$(prog "$p")" "$TMP/bin/$p"; done
tiny_split "$TMP"
expect "tiny model and split run configuration" $?
# NAME.yaml: the split run with its own checkpoints (runs/NAME); long ones run for ever, a step at least 0.3 s
for name in a b c; do
    sed -e "s|default_local_dir: $TMP/runs|default_local_dir: $TMP/runs/$name|" "$TMP/split.yaml" >"$TMP/$name.yaml"
done
for name in b c; do
    sed -i -e 's/total_training_steps: 3/total_training_steps: 1000000, total_epochs: 1000000/' "$TMP/$name.yaml"
    echo 'test: {delay_phase: update_actor, delay_s: [0.3]}' >>"$TMP/$name.yaml"
done
slurm_up 4
expect "a one-node Slurm cluster is up (munged, slurmctld, slurmd; the node idle)" $?
host="$(hostname -s)"
getent hosts "$host" >/dev/null; expect "this host's name ($host) resolves: the workers dial grpod by it" $?

# submit NAME [sbatch options...]: grpo.sbatch with NAME.yaml, its run directory $TMP/NAME.run, its output
# $TMP/NAME.log; prints the job id
submit() {
    local name="$1"
    shift
    (cd "$TMP" && PATH="$TMP/bin:$PATH" GRPO_RUN_DIR="$TMP/$name.run" OPENBLAS_NUM_THREADS=1 \
        sbatch --parsable --job-name="grpo-$name" --nodes=1 --ntasks-per-node=2 --gpus-per-node=0 \
        --cpus-per-task=1 --output="$TMP/$name.log" "$@" "$src/deploy/slurm/grpo.sbatch" "$TMP/$name.yaml")
}
# reached NAME N: the job's run logged step N or a later one
reached() { awk -v n="$2" '/^step +[0-9]+\// { split($2, a, "/"); if (a[1] + 0 >= n) f = 1 } END { exit !f }' "$TMP/$1.log"; }
# port_of NAME: the grpod port the job printed
port_of() { sed -n "s/^grpod on $host:\([0-9]*\),.*/\1/p" "$TMP/$1.log" | tail -n 1; }
# ended_ok JOB: COMPLETED with exit code 0 in the job completion log
ended_ok() {
    [ "$(job_field "$1" JobState)" = COMPLETED ] && [ "$(job_field "$1" ExitCode)" = 0:0 ] ||
        { echo "     job $1: $(grep "^JobId=$1 " "$TMP/slurm/jobcomp.txt" | tail -n 1)"; return 1; }
}
# stopped_with_checkpoint NAME: the trainer stopped on a signal and wrote the checkpoint of the step it stopped at
stopped_with_checkpoint() {
    local k
    k="$(sed -n 's/.*trainer: SIGTERM: stopping at step \([0-9]*\), after a checkpoint.*/\1/p' "$TMP/$1.log" |
        tail -n 1)"
    [ -n "$k" ] && [ -f "$TMP/runs/$1/p/e/checkpoints/global_step_$k/actor/model.safetensors" ] &&
        says "$TMP/$1.log" "checkpoint: step $k saved" || { echo "     $1: no checkpoint of a stop"; return 1; }
    echo "$k" >"$TMP/$1.stop_step"
}

# ---- a clean job
ja="$(submit a)"
wait_for 180 job_ended "$ja" 1
expect "the clean job $ja ends" $?
ended_ok "$ja"; expect "the clean job is COMPLETED with exit code 0 (it was FAILED 137: the EXIT trap under set -e)" $?
pa="$(port_of a)"
[ -n "$pa" ] && says "$TMP/a.log" "registered with grpod at tcp://$host:$pa: role trainer" &&
    says "$TMP/a.log" "pulling rollouts at tcp://*:$((pa + 1))"
expect "the job printed its ports ($pa), and grpod and the data plane use them" $?
says "$TMP/a.log" "run finished at step 3" &&
    [ -f "$TMP/runs/a/p/e/checkpoints/global_step_3/actor/model.safetensors" ]
expect "the run finished and wrote its final checkpoint" $?
! grep -q "orte_enable_recovery" "$TMP/a.log"
expect "no rank warns about mpirun's orte_enable_recovery under srun" $?
! grep -q "Killed\|CANCELLED" "$TMP/a.log"
expect "nothing of the job was killed or cancelled" $?

# ---- two jobs at once: b with a time limit 2 minutes away and its USR1 100 s ahead, c stopped by scancel.
# The port block c's job id maps to is taken (something listens on its first port): c moves to the next one.
taken=$((10000 + ((ja + 2) % ((32768 - 10000) / 64)) * 64))
python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(); time.sleep(3600)' "$taken" & # sleep-ok: a process holding the port, on purpose
wait_for 10 bash -c "(exec 3<>/dev/tcp/127.0.0.1/$taken) 2>/dev/null"
expect "port $taken is taken" $?
jb="$(submit b --time=2 --signal=B:USR1@100)"
jc="$(submit c)"
wait_for 120 bash -c "$(declare -f reached); TMP='$TMP'; reached b 2 && reached c 2"
expect "jobs $jb and $jc both run and make steps" $?
[ "$(job_state "$jb") $(job_state "$jc")" = "RUNNING RUNNING" ]; expect "both are running at once on $host" $?
pb="$(port_of b)" pc="$(port_of c)"
[ -n "$pb" ] && [ -n "$pc" ] && [ $((pb > pc ? pb - pc : pc - pb)) -ge 4 ]
expect "they picked different port blocks ($pb, $pc)" $?
[ "$jc" = $((ja + 2)) ] && [ "$pc" = $((taken + 64)) ]
expect "job $jc moved past the taken port $taken to the next block ($pc)" $?
scancel --batch --signal=USR1 "$jc"
wait_for 120 job_ended "$jc" 1
expect "scancel --batch --signal=USR1 ends job $jc" $?
ended_ok "$jc"; expect "COMPLETED with exit code 0" $?
says "$TMP/c.log" "SIGUSR1 (time limit near, or scancel --batch --signal=USR1)" && stopped_with_checkpoint c
expect "its workers stopped with a checkpoint (before: srun SIGKILLed them)" $?

wait_for 240 job_ended "$jb" 1
expect "job $jb ends before its time limit" $?
ended_ok "$jb"; expect "COMPLETED with exit code 0" $?
stopped_with_checkpoint b; expect "the time limit's USR1: the workers stopped with a checkpoint" $?
kb="$(cat "$TMP/b.stop_step" 2>/dev/null || echo 0)"

# ---- the job that hit its time limit requeued: it resumes from its checkpoint; then scancel
# a requeued job waits for a begin time minutes away; it may start once slurmd has forgotten the credential of its
# first run (cred_expire, 10 s here: slurm_lib.sh): start it 12 s from now, with an hour's time limit (no USR1)
scontrol requeue "$jb" && scontrol update JobId="$jb" StartTime=now+12 TimeLimit=60
expect "scontrol requeue $jb" $?
wait_for 180 grep -q "trainer: resumed from .* at step $kb" "$TMP/b.log"
expect "the requeued job resumes from its checkpoint of step $kb" $?
wait_for 60 reached b $((kb + 2))
expect "and trains on (step $((kb + 2)))" $?
[ "$(grep -c "^grpod on $host:" "$TMP/b.log")" -ge 2 ]
expect "the requeued run's log follows the first run's in the same file (--open-mode=append)" $?
scancel "$jb"
# the job completion log has the job CANCELLED at once; it is over when squeue no longer lists it (completing)
wait_for 120 job_ended "$jb" 2 && wait_for 120 bash -c "[ -z \"\$(squeue -h -j $jb -t PD,CF,R,S,CG 2>/dev/null)\" ]"
expect "scancel ends it" $?
[ "$(job_field "$jb" JobState)" = CANCELLED ]; expect "CANCELLED (scancel's state)" $?
stopped_with_checkpoint b && [ "$(cat "$TMP/b.stop_step")" -gt "$kb" ]
expect "scancel: the workers stopped with a checkpoint at a later step than the first stop's ($kb)" $?
finish "$TMP"/*.log "$TMP/slurm/slurmctld.log"
