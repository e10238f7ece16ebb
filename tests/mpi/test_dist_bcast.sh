#!/usr/bin/env bash
# actor_rollout_ref.rollout.weight_sync=broadcast: each policy version goes from trainer rank 0 to the launch's
# rollout ranks in one broadcast over the collective plane (MPI here, NCCL on GPUs) instead of each rollout
# process fetching it from the dispatcher. It moves the same floats, so:
#  - on-policy, 2 rollout + 1 trainer ranks: every version a step needs is broadcast (4 rounds in 4 steps), none
#    is fetched, and the weights are bit-identical to the same run with weight_sync=fetch;
#  - one-step-off (rollout.mode=async): the versions the next steps need are broadcast (3 rounds), bit-identical
#    to the fetching run;
#  - a rollout TP group (2 ranks) and 1 trainer: the group's first rank takes the broadcast and reshards it;
#  - LoRA: each round carries the adapter alone.
# The lost-member case (a rollout rank killed: the broadcast turns off and the run finishes, bit-identical) is
# in test_dist_grpod.sh, which has grpod to survive a lost rank; the dispatcher's rounds are unit-tested in
# test_dispatch.c.
# usage: test_dist_bcast.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/dist_lib.sh" grpo-bcast
STEPS=4
COMMON=(actor_rollout_ref.model.path="$TMP/tiny" trainer.project_name=p trainer.experiment_name=e
    trainer.total_training_steps=$STEPS trainer.val_before_train=false trainer.test_freq=-1
    data.train_batch_size=4 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2
    data.max_response_length=12 actor_rollout_ref.actor.optim.lr=1e-3 data.synthetic.shots=0 data.synthetic.num_train=64
    data.synthetic.num_val=4 actor_rollout_ref.rollout.update_weights_bucket_megabytes=1 trainer.log_level=debug
    custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score)
weights() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor"; }
run() { # NAME NP EXTRA...
    local name="$1" np="$2"
    shift 2
    timeout "$(scaled 300)" "${MPIRUN[@]}" -np "$np" "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/$name" "$@" \
        >"$TMP/$name.log" 2>&1
}
rounds() { grep -c "broadcast to $2 rollout process(es) over mpi: [0-9]* bytes" "$TMP/$1.log"; }
fetched() { grep -c "in [0-9]* chunk(s)" "$TMP/$1.log"; }

for mode in sync async; do
    PLACE=(placement.trainer_ranks=1 placement.rollout_ranks=2 actor_rollout_ref.rollout.mode=$mode)
    run "fetch-$mode" 3 "${PLACE[@]}"
    expect "$mode: 2 rollout + 1 trainer ranks, weight_sync=fetch, finish" $?
    run "bcast-$mode" 3 "${PLACE[@]}" actor_rollout_ref.rollout.weight_sync=broadcast
    expect "$mode: the same with weight_sync=broadcast finishes" $?
    grep -q "policy versions go to the 2 rollout process(es) of the launch in a broadcast" "$TMP/bcast-$mode.log"
    expect "$mode: the trainer says the versions go in a broadcast" $?
    want=$([ $mode = sync ] && echo 4 || echo 3)
    n="$(rounds "bcast-$mode" 2)"
    [ "$n" -eq "$want" ]; expect "$mode: $want rounds, one per version a step needs (counted $n)" $?
    k="$(grep -c "in the trainers' broadcast" "$TMP/bcast-$mode.log")"
    [ "$k" -eq $((2 * want)) ]; expect "$mode: each rollout rank takes each round ($k of $((2 * want)))" $?
    f="$(fetched "bcast-$mode")"
    [ "$f" -eq 0 ]; expect "$mode: no version is fetched in chunks ($f)" $?
    [ "$(fetched "fetch-$mode")" -ge "$want" ]; expect "$mode: the fetching run fetched them" $?
    ! grep -q "weight broadcast off\|giving the group up" "$TMP/bcast-$mode.log"
    expect "$mode: the broadcast never gives up" $?
    "$COMPARE" "$(weights "fetch-$mode")" "$(weights "bcast-$mode")" 0 >"$TMP/cmp-$mode.txt" 2>&1
    rc=$?
    expect "$mode: broadcast and fetch give bit-identical weights ($(cat "$TMP/cmp-$mode.txt"))" $rc
    python3 - "$TMP/bcast-$mode/p/e/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert len(rows) == 4, len(rows)
# no bytes served in chunks; the broadcast's time is in timing_s/update_weights
assert all(r["perf/update_weights_bytes"] == 0 for r in rows), [r["perf/update_weights_bytes"] for r in rows]
assert all(r["timing_s/update_weights"] > 0 for r in rows[:3]), [r["timing_s/update_weights"] for r in rows]
print("no chunk bytes served; the rounds' time is reported")
PY
    expect "$mode: metrics: no chunk bytes, the rounds timed" $?
done

# a rollout TP group of 2: its first rank is the member, and reshards each version to its peer
PLACE=(placement.trainer_ranks=1 placement.rollout_ranks=2 actor_rollout_ref.rollout.tensor_model_parallel_size=2)
run tp-fetch 3 "${PLACE[@]}"
expect "rollout TP 2 + 1 trainer, fetch, finishes" $?
run tp-bcast 3 "${PLACE[@]}" actor_rollout_ref.rollout.weight_sync=broadcast
expect "rollout TP 2 + 1 trainer, broadcast, finishes" $?
n="$(rounds tp-bcast 1)"
[ "$n" -eq 4 ]; expect "rollout TP: 4 rounds to the group's first rank ($n)" $?
grep -q "bytes in the trainers' broadcast in [0-9.]*s; resharded to 2 TP ranks" "$TMP/tp-bcast.log"
expect "rollout TP: the first rank reshards what the broadcast brought" $?
"$COMPARE" "$(weights tp-fetch)" "$(weights tp-bcast)" 0 >"$TMP/cmp-tp.txt" 2>&1
rc=$?
expect "rollout TP: broadcast and fetch give bit-identical weights ($(cat "$TMP/cmp-tp.txt"))" $rc

# LoRA: a version is the adapter alone, broadcast the same way
PLACE=(placement.trainer_ranks=1 placement.rollout_ranks=2 actor_rollout_ref.model.lora_rank=4
    actor_rollout_ref.model.lora_alpha=8)
run lora-fetch 3 "${PLACE[@]}"
expect "LoRA, fetch, finishes" $?
run lora-bcast 3 "${PLACE[@]}" actor_rollout_ref.rollout.weight_sync=broadcast
expect "LoRA, broadcast, finishes" $?
n="$(rounds lora-bcast 2)"
[ "$n" -eq 4 ]; expect "LoRA: 4 rounds ($n)" $?
a="$(grep -o "policy version 1 broadcast to 2 rollout process(es) over mpi: [0-9]* bytes" "$TMP/lora-bcast.log" |
    grep -o "[0-9]* bytes")"
b="$(grep -o "policy version 1 published ([0-9]* bytes)" "$TMP/lora-bcast.log" | grep -o "[0-9]* bytes")"
[ -n "$a" ] && [ "$a" = "$b" ]; expect "LoRA: a round carries the adapter's bytes ($a, published $b)" $?
[ -s "$(weights lora-fetch)/adapter_model.safetensors" ] &&
    cmp "$(weights lora-fetch)/adapter_model.safetensors" "$(weights lora-bcast)/adapter_model.safetensors"
expect "LoRA: broadcast and fetch give bit-identical adapters" $?

finish "$TMP"/bcast-*.log "$TMP"/tp-bcast.log
