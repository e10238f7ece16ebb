#!/usr/bin/env bash
# Trainer-loss survival (trainer.survive_trainer_loss) with trainer.device=cuda: 3 colocated plain-DP ranks of this
# build (against Open MPI 5, CUDA emulated on the CPU: tests/cuemu, a device per rank, CUEMU_DEVICES=3) under
# scripts/mpirun_ft, the gradients summed over NCCL (worker/comm/comm_nccl.c over the emulated NCCL):
#  - rank 1 SIGKILLed in step 2's gradient all-reduce on NCCL (its bucket's ncclAllReduce queued, not waited for:
#    allreduce-start:2:1, a hold the test waits on, not a sleep), with the emulated NCCL told not to notice a dead peer
#    (CUEMU_NCCL_PEER_LOSS=silent: as NCCL over a node's shared memory or NVLink may not): the survivors' NCCL waits
#    find the loss through MPI (ULFM) beside them, abort their communicators, shrink, make a new one over the 2
#    survivors (its unique id from their rank 0 over their shrunk MPI group) and redo step 2;
#  - the lead (rank 0) SIGKILLed there (allreduce-start:2:0), the emulated NCCL noticing (ncclRemoteError): launch rank 1
#    leads from step 2 and makes the new communicator's unique id;
#  each (2 steps): the run finishes (mpirun exits 0), the log names the lost rank, the shrink to 2 and the redone
#  step, the survivors say the loss came to them in NCCL's wait and that the new communicator was made and summed
#  the redone step's gradients, the weights equal the one-process run's on the device within 1e-5 (every DP layout
#  reproduces it, so DP 3 for step 1 and DP 2 for step 2 does too), the audit files hold every group of every step
#  exactly rollout.n times, metrics.jsonl each step once;
#  - rank 1 SIGKILLed in step 2's first optimizer step (optim:2:1): the survivors restore a start their own first
#    update changed since, copied out beside the step's work (k_to_host_behind); the weights one process's;
#  - a spare (4 ranks, a device each): rank 1 SIGKILLed in step 2's all-reduce, the spare takes its place (its state
#    from DP rank 0, staged through host memory), a new NCCL communicator over 3, the weights one process's;
#  - ZeRO-1 on the device (3 ranks; and 4 with a spare): rank 1 SIGKILLed in step 2's optimizer step, its block of
#    the moments rebuilt from
#    the next rank's host copy and re-sharded into the survivors' devices (and the spare's), the weights one
#    process's;
#  - model copies (DP 2 x TP 2, DP 2 x PP 2 on 4 ranks, a device each, TP's and PP's collectives over NCCL): rank 1
#    killed with step 2's generation done (gen:2:1), and rank 3 in step 2's optimizer step (optim:2:3): its copy
#    leaves, the other remakes its NCCL communicators and goes on as DP 1, the weights one process's;
#  - with ZeRO-1, DP 2 x TP 2: rank 3 killed in step 2's optimizer step; the copy left keeps the whole moments (DP 1),
#    the weights one process's;
#  - a spare with TP (DP 2 x TP 2 and a spare, 5 ranks): rank 1 killed, the spare takes its shard into its device,
#    DP stays 2, the weights one process's;
#  - a split run (3 trainers and a rollout rank, a device each): trainer rank 1 SIGKILLed in step 2's all-reduce on
#    NCCL, the survivors redo the step on a new communicator from the units the lead kept, the weights one
#    process's; and the lead killed there: trainer rank 1 takes the lead, the weights one process's; and with DP 2 x
#    TP 2 trainers, a rank of the lead's copy killed: the other copy takes the lead, the weights one process's.
# Skipped (77) without Open MPI 5 (scripts/ompi5_env.sh --no-install).
set -u
. "$(dirname "$0")/../lib.sh" grpo-ft-nccl
STEPS=2
# shellcheck source=tests/ft/survive_lib.sh
. "$(dirname "$0")/survive_lib.sh"
survive_start
export CUEMU_DEVICES=3 CUEMU_NCCL_PEER_LOSS=notice
MPIRUN+=(-x CUEMU_DEVICES -x CUEMU_NCCL_PEER_LOSS)

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 1 grpo-worker $(keys one) trainer.device=cuda >"$TMP/one.log" 2>&1
expect "one process on the device: $STEPS steps" $?
says "$TMP/one.log" "model: kernels: cuda:0"
expect "one process: the policy runs on the (emulated) device" $?

# killed RANK HOW: 3 ranks on the device whose rank RANK holds in step 2's gradient all-reduce and is SIGKILLed
# there; HOW: the emulated NCCL's CUEMU_NCCL_PEER_LOSS (notice or silent)
killed() {
    local name="nccl-$1-$2"
    CUEMU_NCCL_PEER_LOSS=$2 start_held "$name" 3 "allreduce-start:2:$1" trainer.device=cuda
    kill_held "$name" "rank $1 in step 2's all-reduce on NCCL"
    wait "$JOB"
    expect "$name: the run finishes without rank $1 (mpirun exits 0)" $?
    says "$TMP/$name.log" "3 DP ranks on GPUs: gradients summed over NCCL, in device memory"
    expect "$name: the gradients were summed over NCCL" $?
    survived "$name" 2 "$1" 2
    local found rc
    grep -aEq "\] survive: step 2: NCCL all-reduce \(a gradient bucket\) over 3 ranks \(this is rank [0-9]\): a peer is lost \($3" \
        "$TMP/$name.log"
    rc=$?
    # each survivor's word: where the loss came from
    found="$(grep -aoE "\[rank [0-9]\] survive: step 2: NCCL .*a peer is lost \(.*, after [0-9.]+ s\)" "$TMP/$name.log" |
        sed -E 's/ survive: step 2: NCCL .*a peer is lost / /' | tr '\n' ' ')"
    expect "$name: a survivor found the loss in its NCCL wait ($3...: ${found% })" $rc
    says "$TMP/$name.log" "the lost group's NCCL communicators aborted; a new one over the 2 survivors"
    expect "$name: the survivors made a new NCCL communicator" $?
    says "$TMP/$name.log" "2 DP ranks on GPUs: gradients summed over NCCL, in device memory"
    expect "$name: the redone step's gradients summed over the new NCCL communicator" $?
    same_as_one "$name"
    metrics_once "$name"
}
# NCCL does not notice: MPI's word, asked beside the wait
killed 1 silent "MPI: "
# NCCL notices too (the emulator's ncclRemoteError; MPI may say it first); the lead lost
killed 0 notice "(NCCL|MPI): "
says "$TMP/nccl-0-notice.log" "the lead (rank 0) lost: rank 1 leads from step 2"
expect "nccl-0-notice: launch rank 1 leads from step 2" $?

# the step's start copied out of the devices beside the step's work (a copy stream; the first optimizer step waits
# for it on the device): rank 1 SIGKILLed in step 2's first optimizer step, so the survivors, which took theirs,
# find the loss in the second mini-batch's all-reduce and restore a start their own update has changed since (the
# update's wait for the copy itself is gpu-kernels' "keep beside": here generation's frees order it too)
CUEMU_NCCL_PEER_LOSS=silent start_held optim 3 "optim:2:1" trainer.device=cuda
kill_held optim "rank 1 in step 2's optimizer step"
wait "$JOB"
expect "optim: the run finishes without rank 1 (mpirun exits 0)" $?
says "$TMP/optim.log" "survive: step 1's start copied out of the GPU beside the step's work"
expect "optim: each step's start is copied out beside the step's work (the log says so)" $?
survived optim 2 1 2
same_as_one optim
metrics_once optim

# a spare on the device: 3 trainers and a spare, a device each; rank 1 SIGKILLed in step 2's all-reduce on NCCL; the
# spare takes its place (its state from DP rank 0 through host memory), the new NCCL communicator is over 3 again
# (the spare among them), DP stays 3
CUEMU_DEVICES=4 CUEMU_NCCL_PEER_LOSS=silent SPARES=1 start_held spare 4 "allreduce-start:2:1" trainer.device=cuda
kill_held spare "rank 1 in step 2's all-reduce on NCCL"
wait "$JOB"
expect "spare: the run finishes without rank 1 (mpirun exits 0)" $?
survived spare 2 1 3
says "$TMP/spare.log" "spare (launch rank 3) joined as DP rank 2 of 3 for step 2: took the step's start"
expect "spare: the spare joined as DP rank 2 for step 2, its state from DP rank 0" $?
says "$TMP/spare.log" "the lost group's NCCL communicators aborted; a new one over the 3 survivors"
expect "spare: a new NCCL communicator over the two survivors and the spare" $?
[ "$(grep -ac "3 DP ranks on GPUs: gradients summed over NCCL, in device memory" "$TMP/spare.log")" -ge 2 ]
expect "spare: the redone step's gradients summed over NCCL by 3 DP ranks again" $?
says "$TMP/spare.log" "[rank 3] model: kernels: cuda:3"
expect "spare: the spare holds its model on a device of its own (cuda:3)" $?
same_as_one spare
metrics_once spare

# ZeRO-1 on the device (each DP rank's block of AdamW's moments in its device, its copy at the next rank's step start
# in host memory over MPI): rank 1 SIGKILLed in step 2's optimizer step (its block of the gradients summed, its peers
# then waiting for its block of the weights in NCCL's all-gather); its block rebuilt from rank 2's copy, the moments
# re-sharded into the 2 survivors' devices over their new NCCL communicator; and the same with a spare, which takes
# its block from that re-sharding (DP stays 3)
zero_case() {
    local name="$1" np="$2" left="$3"
    CUEMU_DEVICES="$np" CUEMU_NCCL_PEER_LOSS=silent start_held "$name" "$np" "optim:2:1" trainer.device=cuda \
        actor_rollout_ref.actor.megatron.use_distributed_optimizer=true
    kill_held "$name" "rank 1 in step 2's optimizer step"
    wait "$JOB"
    expect "$name: the run finishes without rank 1 (mpirun exits 0)" $?
    says "$TMP/$name.log" "ZeRO-1"
    expect "$name: ZeRO-1 on (the log says so)" $?
    survived "$name" 2 1 "$left"
    says "$TMP/$name.log" "a new one over the $left survivors"
    expect "$name: a new NCCL communicator over $left" $?
    same_as_one "$name"
    metrics_once "$name"
}
zero_case zero 3 2
SPARES=1 zero_case zero-spare 4 3
says "$TMP/zero-spare.log" "spare (launch rank 3) joined as DP rank 2 of 3 for step 2"
expect "zero-spare: the spare joined as DP rank 2, its block from the re-sharding" $?

# model copies on the devices (DP 2 x TP 2 and DP 2 x PP 2 on 4 ranks, a device each: TP's and PP's collectives over
# NCCL twins of their groups): a rank SIGKILLed; its copy leaves, the other copy makes new NCCL communicators over its
# TP (or PP) group and its DP group of 1, and redoes the step as DP 1
copy_case() {
    local name="$1" spec="$2" rank="$3" idle="$4" key="$5"
    CUEMU_DEVICES=4 CUEMU_NCCL_PEER_LOSS=silent start_held "$name" 4 "$spec" trainer.device=cuda "$key=2"
    kill_held "$name" "rank $rank ($spec)"
    wait "$JOB"
    expect "$name: the run finishes without rank $rank (mpirun exits 0)" $?
    says "$TMP/$name.log" "on GPUs: activations, gradients and stage hand-offs over NCCL, in device memory"
    expect "$name: the copy's collectives over NCCL" $?
    survived "$name" 2 "$rank" 1
    says "$TMP/$name.log" "the copy that lost it left, launch rank $idle idle" &&
        says "$TMP/$name.log" "launch rank $idle released: the run ended"
    expect "$name: the copy of rank $rank left, launch rank $idle idle until the end" $?
    says "$TMP/$name.log" "the model copies' aborted NCCL communicators made again over the survivors' groups"
    expect "$name: the copy left made its TP/PP communicators again" $?
    same_as_one "$name"
    metrics_once "$name"
}
copy_case tp gen:2:1 1 0 actor_rollout_ref.actor.megatron.tensor_model_parallel_size
copy_case pp optim:2:3 3 1 actor_rollout_ref.actor.megatron.pipeline_model_parallel_size
# with ZeRO-1 (DP 2 x TP 2): rank 3 killed in step 2's optimizer step, its copy leaves; the copy left, now DP 1,
# keeps the whole moments (its block and the other copy's, rebuilt from its host copy) in its devices, as a launch of
# DP 1 does (no ZeRO-1 over one rank, which has no NCCL twin: the emulator caught the host writing device memory)
CUEMU_DEVICES=4 CUEMU_NCCL_PEER_LOSS=silent start_held tpzero 4 optim:2:3 trainer.device=cuda \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
    actor_rollout_ref.actor.megatron.use_distributed_optimizer=true
kill_held tpzero "rank 3 in step 2's optimizer step (ZeRO-1)"
wait "$JOB"
expect "tpzero: DP 2 x TP 2 with ZeRO-1, the run finishes without rank 3 (mpirun exits 0)" $?
says "$TMP/tpzero.log" "ZeRO-1: DP rank 1 keeps the optimizer state of parameters"
expect "tpzero: ZeRO-1 over the 2 copies" $?
survived tpzero 2 3 1
! grep -aq "cuemu: host code touched device memory" "$TMP/tpzero.log"
expect "tpzero: no host access to device memory (the emulator says none)" $?
same_as_one tpzero
metrics_once tpzero

# a spare with TP on the devices (DP 2 x TP 2 and a spare, 5 ranks, a device each): rank 1 killed with step 2's
# generation done; the spare cuts rank 1's shard of its whole weights in host memory into its own device, takes the
# shard's step start from DP rank 1's copy, and makes the TP and DP NCCL communicators with the others; DP stays 2
SPARES=1 CUEMU_DEVICES=5 CUEMU_NCCL_PEER_LOSS=silent start_held tpspare 5 gen:2:1 trainer.device=cuda \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2
kill_held tpspare "rank 1 at step 2's generation (a spare waiting)"
wait "$JOB"
expect "tpspare: DP 2 x TP 2 and a spare on the devices, the run finishes without rank 1 (mpirun exits 0)" $?
says "$TMP/tpspare.log" "[rank 4] model: kernels: cuda:4"
expect "tpspare: the spare on its own device" $?
SPARES=1 survived tpspare 2 1 2
says "$TMP/tpspare.log" "spare (launch rank 4) took launch rank 1's place (TP rank 1, PP stage 0 of DP rank 0 of 2) for step 2"
expect "tpspare: the spare took rank 1's shard" $?
! grep -aq "cuemu: host code touched device memory" "$TMP/tpspare.log"
expect "tpspare: no host access to device memory (the emulator says none)" $?
same_as_one tpspare
metrics_once tpspare

# a split run on the devices (3 trainers and a rollout rank, a device each): split_case NAME VICTIM WHAT SAYS kills
# trainer rank VICTIM in step 2's all-reduce on NCCL; the survivors make a new communicator over 2 and redo step 2,
# the log saying SAYS; the weights one process's, every group trained once
split_case() {
    local name="$1" victim="$2"
    CUEMU_DEVICES=4 CUEMU_NCCL_PEER_LOSS=silent TRAINERS=3 start_held "$name" 4 "allreduce-start:2:$victim" \
        trainer.device=cuda placement.trainer_ranks=3 placement.rollout_ranks=1
    kill_held "$name" "$3"
    wait "$JOB"
    expect "$name: the run finishes without trainer rank $victim (mpirun exits 0)" $?
    survived "$name" 2 "$victim" 2
    says "$TMP/$name.log" "a new one over the 2 survivors" && says "$TMP/$name.log" "$4"
    expect "$name: a new NCCL communicator over 2, and: $4" $?
    same_as_one "$name"
    metrics_once "$name"
}
# trainer rank 1: step 2 redone from the units the lead kept
split_case split 1 "trainer rank 1 in step 2's all-reduce on NCCL" \
    "step 2 redone from the 1 work unit(s) this rank kept: none pulled again"
# the lead: trainer rank 1 takes the lead at step 2's redo, publishing the step's version from its device's weights,
# and the rollout rank generates step 2 again for it
split_case splitlead 0 "the lead in step 2's all-reduce on NCCL" \
    "step 2: this rank (launch DP rank 1) leads the split run now"
# DP 2 x TP 2 trainers of a split run on the devices (4 trainer ranks and a rollout rank): trainer rank 1 (the lead's
# copy) killed in step 2's optimizer step; the lead, alive, closes its sockets, and the other copy takes the lead,
# both its ranks giving their parts of the step's version from their devices
CUEMU_DEVICES=5 CUEMU_NCCL_PEER_LOSS=silent TRAINERS=4 start_held splittp 5 "optim:2:1" \
    trainer.device=cuda placement.trainer_ranks=4 placement.rollout_ranks=1 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2
kill_held splittp "trainer rank 1 (the lead's copy) in step 2's optimizer step on the devices"
wait "$JOB"
expect "splittp: DP 2 x TP 2 trainers on the devices, the run finishes without trainer rank 1 (mpirun exits 0)" $?
survived splittp 2 1 1
says "$TMP/splittp.log" "[rank 2] trainer: step 2: this rank (launch DP rank 1) leads the split run now"
expect "splittp: the other copy takes the lead" $?
! grep -aq "cuemu: host code touched device memory" "$TMP/splittp.log"
expect "splittp: no host access to device memory (the emulator says none)" $?
same_as_one splittp
metrics_once splittp
finish
