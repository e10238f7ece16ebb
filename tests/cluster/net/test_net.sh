#!/usr/bin/env bash
# A cluster of three namespace hosts (tests/cluster/net/hosts_lib.sh): grpod on hostc on TCP with its secret,
# trainers on hosta, rollout ranks on hostb, Open MPI across them, no grpod.data_endpoint (the run chooses TCP by
# itself because its ranks are on two hosts). Each run is checked against the undisturbed single-process run's
# weights and its audit (every group exactly rollout.n times per step):
#  - split run, undisturbed; colocated run across hosta and hostb;
#  - hostb's link down for 8 s mid-run, then up;
#  - 5% loss and 50 ms delay on hostb's link for the whole run;
#  - hostb cut off from hosta but not from grpod for 8 s;
#  - a rollout rank killed, then the whole rollout host's processes; replaced with grpo-worker --replace-rank; the
#    run finishes, and mpirun exits 0 promptly after a run that lost ranks;
#  - the trainer host lost: every rank on every host ends within the deadline with the reason, mpirun too; the
#    relaunch resumes and ends bit-identical.
# PHASES (a space-separated list, default all) runs some of them.
# usage: test_net.sh GRPOD GRPOCTL GRPO_WORKER GRPO_MODEL COMPARE_WEIGHTS SCORER_SO
GRPOD="$1" GRPOCTL="$2" WORKER="$3" MODEL_TOOL="$4" COMPARE="$5" SCORER="$6"
. "$(dirname "$0")/hosts_lib.sh" grpo-net
hosts_up || finish
CHECK_AUDIT="$SRC_ROOT/tests/mpi/check_audit.py"
PHASES="${PHASES:-split colocated linkdown netem partition replace trainerlost}"
want() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }

tiny_model "$TMP/tiny"
expect "tiny model initialised" $?
STEPS=4
N=4 B=4
keys() {
    echo actor_rollout_ref.model.path="$TMP/tiny" trainer.default_local_dir="$TMP/$1" trainer.project_name=p \
        trainer.experiment_name=e trainer.total_training_steps=$STEPS trainer.val_before_train=false \
        trainer.test_freq=-1 trainer.save_freq=1 data.train_batch_size=$B actor_rollout_ref.rollout.n=$N \
        actor_rollout_ref.actor.ppo_mini_batch_size=2 data.max_response_length=12 actor_rollout_ref.actor.optim.lr=1e-3 \
        data.synthetic.num_train=64 data.synthetic.num_val=4 custom_reward_function.path="$SCORER" \
        custom_reward_function.name=byte_score trainer.rollout_data_dir="$TMP/$1/audit" trainer.log_level=info
}
final() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor"; }
SPLIT=(placement.trainer_ranks=2 placement.rollout_ranks=2)
GRPOD_KEYS=(grpod.heartbeat_interval_s=0.5 grpod.heartbeat_timeout_s=4)

# the undisturbed single-process run (in the root namespace)
# shellcheck disable=SC2046
timeout 300 "$WORKER" $(keys ref) >"$TMP/ref.log" 2>&1
expect "reference run (one process) finishes" $?

# mpi NAME HOSTS NP [key=value...]: mpirun on hosta, ranks over HOSTS, under grpod; log $TMP/NAME.log; pid MPI_PID
mpi() {
    local name="$1" hosts="$2" np="$3"; shift 3
    # shellcheck disable=SC2046
    on hosta "${MPIRUN_NET[@]}" --mca orte_enable_recovery 1 --host "$hosts" -np "$np" "$WORKER" $(keys "$name") \
        grpod.endpoint="$EP" grpod.secret_file="$SECRET" grpod.connect_timeout_s=30 "$@" >>"$TMP/$name.log" 2>&1 &
    MPI_PID=$!
    track "$MPI_PID"
}
# same NAME: weights within 1e-5 of the single-process run's, and the audit
same() {
    local rc
    "$COMPARE" "$(final ref)" "$(final "$1")" 1e-5 >"$TMP/cmp-$1.txt" 2>&1
    rc=$?; expect "$1: weights match the single-process run's ($(tail -1 "$TMP/cmp-$1.txt"))" $rc
    python3 "$CHECK_AUDIT" "$TMP/$1/audit" $N $B $STEPS >"$TMP/audit-$1.txt" 2>&1
    rc=$?; expect "$1: every group exactly $N times in each step ($(tail -1 "$TMP/audit-$1.txt"))" $rc
}
# ended_within SECONDS: mpirun ($MPI_PID) exits within SECONDS; its status in MPI_RC
ended_within() {
    local s=$1 t0
    t0=$(date +%s)
    while kill -0 "$MPI_PID" 2>/dev/null && [ $(($(date +%s) - t0)) -lt "$s" ]; do sleep 0.2; done
    kill -0 "$MPI_PID" 2>/dev/null && { MPI_RC=124; return 1; }
    wait "$MPI_PID"; MPI_RC=$?
    return 0
}
step_at_least() { [ "$(ctl status --json 2>/dev/null | jq -r .step)" -ge "$1" ] 2>/dev/null; }

grpod_up hostc "${SPLIT[@]}" "${GRPOD_KEYS[@]}"
expect "grpod on hostc, TCP with its secret" $?

if want split; then
    mpi split hosta:2,hostb:2 4 "${SPLIT[@]}"
    ended_within 300; expect "split run across two hosts finishes (mpirun exit $MPI_RC)" "$MPI_RC"
    has "$TMP/grpod.log" "its data plane goes over TCP"; expect "grpod sees the run span hosts and hands out TCP" $?
    has "$TMP/split.log" "tcp://hosta:"; expect "the rollout ranks dial the trainers on hosta over TCP" $?
    same split
fi
finish
