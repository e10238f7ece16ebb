# shellcheck shell=bash
# Sourced by tests/cluster/slurm/*.sh after tests/lib.sh: a one-node Slurm cluster started by hand, everything under
# $TMP/slurm and killed at exit (tests/lib.sh tracks the daemons).
#   slurm_up CPUS: munged, slurmctld and slurmd in the foreground as background jobs, this host the one node with
#                  CPUS CPUs; SLURM_CONF exported; returns 1 when the node is not idle within 60 s
#   job_field JOBID FIELD: the field (JobState, ExitCode, ...) of the job's line in the job completion log (jobcomp/
#                  filetxt: one line per job end, kept after slurmctld forgets the job), its newest end
#   job_ended JOBID N: the job ended N times or more (a requeued job ends once per run)
#   job_state JOBID: the job's state now (scontrol)
#   slurm_down: (at exit) every job cancelled and ended, before tests/lib.sh kills the daemons

# slurm_missing: the first program a cluster needs that is not installed (empty: none)
slurm_missing() {
    local p
    for p in munged slurmctld slurmd sbatch scontrol scancel sinfo; do
        command -v "$p" >/dev/null || { echo "$p"; return; }
    done
}

# free_port: a TCP port nothing listens on now
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

slurm_up() {
    local s="$TMP/slurm" host
    host="$(hostname -s)"
    mkdir -p "$s/state" "$s/spool" "$s/munge" && chmod 700 "$s/munge"
    (umask 077; head -c 1024 /dev/urandom >"$s/munge/munge.key")
    # --force: /tmp's sticky, world-writable directories above the socket are refused otherwise
    munged -F --force --key-file="$s/munge/munge.key" --socket="$s/munge/munge.sock" \
        --pid-file="$s/munge/munged.pid" --log-file="$s/munged.log" --seed-file="$s/munge/seed" \
        >>"$s/munged.log" 2>&1 &
    track $!
    wait_for 10 test -S "$s/munge/munge.sock" || { echo "munged did not start"; return 1; }
    # SlurmdParameters=config_overrides: the node has the CPUs named here, whatever the machine has (two jobs of
    # two tasks each run at once on a 2-core CI machine). MinJobAge: scontrol remembers ended jobs an hour.
    # jobcomp/filetxt: every job end with its state and exit code, without a database (sacct needs slurmdbd).
    # proctrack/linuxproc and task/none: no cgroups in a container.
    cat >"$s/slurm.conf" <<CONF
ClusterName=grpotest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$s/munge/munge.sock,cred_expire=10
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd.pid
SlurmctldLogFile=$s/slurmctld.log
SlurmdLogFile=$s/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$s/jobcomp.txt
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
KillWait=60
JobRequeue=1
NodeName=$host NodeAddr=127.0.0.1 CPUs=$1 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    export SLURM_CONF="$s/slurm.conf"
    SLURM_STEPDS_BEFORE="$(pgrep -x slurmstepd)" # not this cluster's
    trap 'slurm_down; lib_cleanup' EXIT
    slurmctld -D -i >>"$s/slurmctld.out" 2>&1 &
    track $!
    slurmd -D >>"$s/slurmd.out" 2>&1 &
    track $!
    wait_for 60 bash -c "[ \"\$(sinfo -h -n $host -o %t 2>/dev/null)\" = idle ]" ||
        { echo "the node is not idle:"; sinfo; tail -5 "$s"/*.log; return 1; }
}

job_field() {
    grep "^JobId=$1 " "$TMP/slurm/jobcomp.txt" 2>/dev/null | tail -n 1 | tr ' ' '\n' | sed -n "s/^$2=//p"
}
job_ended() { [ "$(grep -c "^JobId=$1 " "$TMP/slurm/jobcomp.txt" 2>/dev/null)" -ge "$2" ]; }
job_state() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p'; }

# slurm_down: at exit, before tests/lib.sh kills the daemons: every job of this cluster cancelled and gone (slurmd's
# slurmstepd processes are not its children: they end with their jobs)
slurm_down() {
    [ -n "${SLURM_CONF:-}" ] || return 0
    scancel --full --quiet --user=root 2>/dev/null
    wait_for 30 bash -c '[ -z "$(squeue -h 2>/dev/null)" ]' || echo "jobs left: $(squeue -h 2>/dev/null)"
    # a slurmstepd left over (its job did not end: the test was cut short) would outlive the cluster
    local p
    for p in $(pgrep -x slurmstepd); do
        grep -qxw "$p" <<<"$SLURM_STEPDS_BEFORE" || kill -KILL "$p" 2>/dev/null
    done
}
