#!/usr/bin/env bash
# Sequence and context parallelism on a mixture-of-experts model (issues 30 and 31) reproduce the single-process
# run (mpirun --oversubscribe on 2 cores), on tiny random Qwen3-MoE and Mixtral models with the load-balancing loss
# on and the rollout's experts replayed (actor_rollout_ref.actor.router_replay.mode=R3):
#  - Ulysses SP2 and CP2 (2 colocated ranks), SP2 x DP2, SP2 x DP2 with ZeRO-1, CP2 x DP2, SP2 x PP2 and CP2 x PP2
#    (4 ranks), with expert parallelism SP2 x EP2 and CP2 x EP2 (4 ranks: the experts' gradients summed over the
#    ranks holding them and over the SP group), SP2 x EP2 x TP2, CP2 x EP2 x TP2 and SP2 x EP2 x PP2 (8 ranks), and
#    split runs (2 SP2 or CP2 trainer ranks, or 4 of SP2 x EP2 or CP2 x EP2, and a rollout rank) give one
#    process's per-step losses, grad norms and entropies, the router's metrics (actor/moe/...: the load-balancing
#    loss and the tokens per expert counted over the whole micro-batch, every rank of the group holding a slice of
#    its tokens), the routing-replay metrics
#    (training/rollout_routing_mismatch, training/rollout_routing_replay) and the weights after two GRPO steps,
#    within 1e-5 relative; CP packs whole sequences (no shared-prompt packing), and the load-balancing loss counts
#    the tokens of a micro-batch as packed (a shared prompt once, a whole sequence's every time), so CP runs are
#    compared with one process packing whole sequences too (actor_rollout_ref.actor.shared_prompt_packing=false);
#  - SP2 and CP2 with LoRA on the attention, the experts and the router give one process's metrics and adapter;
#  - split one step off (rollout.mode=async), where the rollout's experts differ from the trainer's own choice at
#    step 2, SP2 and CP2 trainers give one trainer rank's run (the replayed experts sliced like the tokens);
#  - with ZeRO-1 too (SP2 x EP2, CP2 x EP2, and SP2 x EP2 x DP2: 8 ranks, the experts' optimizer state over the 2
#    ranks holding the same experts, the dense one over DP x SP), and SP2 x EP2 x DP2's checkpoint resumes in one
#    process at the one-process weights.
# usage: test_sp_moe.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-sp-moe
test_env
MPIRUN=(timeout "$(scaled 300)" mpirun --oversubscribe --bind-to none)
. "$(dirname "$0")/equiv_lib.sh"
SP=actor_rollout_ref.actor.ulysses_sequence_parallel_size
CP=actor_rollout_ref.actor.megatron.context_parallel_size
EP=actor_rollout_ref.actor.megatron.expert_model_parallel_size
TP=actor_rollout_ref.actor.megatron.tensor_model_parallel_size
RTP=actor_rollout_ref.rollout.tensor_model_parallel_size
ZERO=actor_rollout_ref.actor.megatron.use_distributed_optimizer=true
PP=actor_rollout_ref.actor.megatron.pipeline_model_parallel_size
NOSHARE=actor_rollout_ref.actor.shared_prompt_packing=false
MOE="actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.5 actor_rollout_ref.actor.router_replay.mode=R3"

# NAME MODEL RANKS [more keys...]: colocated ranks
colo() {
    local name=$1 model=$2 ranks=$3
    shift 3
    # shellcheck disable=SC2046,SC2086 # the words of common and MOE are keys
    "${MPIRUN[@]}" -np "$ranks" "$WORKER" $(common "$model") $MOE trainer.default_local_dir="$TMP/$name" \
        trainer.nnodes=1 trainer.n_gpus_per_node="$ranks" "$@" >"$TMP/$name.log" 2>&1
}
# the router's and the routing replay's metrics of run B against run A
same_moe() {
    python3 - "$TMP/$1/p/e/metrics.jsonl" "$TMP/$2/p/e/metrics.jsonl" <<'PY'
import json, sys
a, b = ({r["step"]: r for r in map(json.loads, open(p)) if r["step"] >= 1} for p in sys.argv[1:3])
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
for s in a:
    for k in ("actor/moe/aux_loss", "actor/moe/load_imbalance", "actor/moe/tokens_per_expert/max",
              "actor/moe/tokens_per_expert/min", "training/rollout_routing_mismatch",
              "training/rollout_routing_replay"):
        x, y = a[s][k], b[s][k]
        if abs(x - y) > 1e-5 * max(abs(x), 1e-3):
            sys.exit(f"step {s} {k}: {x} against {y}")
    assert a[s]["actor/moe/aux_loss"] > 0 and a[s]["training/rollout_routing_replay"] == 1, a[s]
print("same routing")
PY
}

for kind in qwen3_moe mixtral; do
    tiny_moe_model "$TMP/$kind" $kind 11
    expect "$kind: tiny model written" $?
    # shellcheck disable=SC2046,SC2086
    "$WORKER" $(common $kind) $MOE trainer.default_local_dir="$TMP/one-$kind" >"$TMP/one-$kind.log" 2>&1
    expect "$kind: single-process run finishes" $?
    # shellcheck disable=SC2046,SC2086
    "$WORKER" $(common $kind) $MOE $NOSHARE trainer.default_local_dir="$TMP/whole-$kind" >"$TMP/whole-$kind.log" 2>&1
    expect "$kind: single-process run packing whole sequences finishes" $?
done

# NAME MODEL RANKS REFERENCE [keys...]
for layout in "sp2 qwen3_moe 2 one $SP=2" "cp2 qwen3_moe 2 whole $CP=2" "sp2 mixtral 2 one $SP=2" \
    "cp2 mixtral 2 whole $CP=2" "sp2dp2 qwen3_moe 4 one $SP=2" "cp2dp2 qwen3_moe 4 whole $CP=2" \
    "sp2dp2-zero1 qwen3_moe 4 one $SP=2 $ZERO" "sp2pp2 qwen3_moe 4 one $SP=2 $PP=2" \
    "cp2pp2 qwen3_moe 4 whole $CP=2 $PP=2" "sp2ep2 qwen3_moe 4 one $SP=2 $EP=2" "cp2ep2 qwen3_moe 4 whole $CP=2 $EP=2" \
    "sp2ep2 mixtral 4 one $SP=2 $EP=2" "sp2ep2tp2 qwen3_moe 8 one $SP=2 $EP=2 $TP=2 $RTP=2" \
    "cp2ep2tp2 qwen3_moe 8 whole $CP=2 $EP=2 $TP=2 $RTP=2" "sp2ep2pp2 qwen3_moe 8 one $SP=2 $EP=2 $PP=2 $RTP=2" \
    "sp2ep2-zero1 qwen3_moe 4 one $SP=2 $EP=2 $ZERO" "cp2ep2-zero1 qwen3_moe 4 whole $CP=2 $EP=2 $ZERO" \
    "sp2ep2dp2-zero1 qwen3_moe 8 one $SP=2 $EP=2 $ZERO $RTP=2"; do
    set -- $layout
    name=$1-$2 ref=$4-$2
    colo "$name" "$2" "$3" "${@:5}"
    expect "$name: $3 colocated ranks finish" $?
    out=$(same_metrics "$ref" "$name" 2>&1)
    expect "$name: per-step losses, grad norms and entropies match one process ($out)" $?
    out=$(same_moe "$ref" "$name" 2>&1)
    expect "$name: the router's and the routing replay's metrics match one process ($out)" $?
    out=$(same_weights "$ref" "$name")
    expect "$name: weights after $STEPS steps match one process ($out)" $?
done

# LoRA (rank 8, all-linear: the attention, each expert's MLP and the router) under SP 2 and CP 2. Adam's eps 1e-5
# here: the adapters' B start at zero, so after the first update the experts' lora_A gradients are about lr times
# the usual, near eps 1e-6, where a float32 sum taken in another order (the ranks' parts) moves a weight by a
# percent of lr (CP 2 measured 1e-4 of the largest weight at eps 1e-6, 3e-6 at 1e-5; the gradients themselves match
# the whole model's within 1e-5 in model-cp*, check_moe)
EPS=actor_rollout_ref.actor.optim.eps=1e-5
# shellcheck disable=SC2046,SC2086
"$WORKER" $(common qwen3_moe) $MOE $LORA $EPS trainer.default_local_dir="$TMP/one-lora" >"$TMP/one-lora.log" 2>&1
expect "qwen3_moe: single-process LoRA run finishes" $?
# shellcheck disable=SC2046,SC2086
"$WORKER" $(common qwen3_moe) $MOE $LORA $EPS $NOSHARE trainer.default_local_dir="$TMP/whole-lora" >"$TMP/whole-lora.log" 2>&1
expect "qwen3_moe: single-process LoRA run packing whole sequences finishes" $?
for layout in "sp2-lora one-lora $SP=2" "cp2-lora whole-lora $CP=2"; do
    set -- $layout
    # shellcheck disable=SC2046,SC2086
    colo "$1" qwen3_moe 2 $LORA $EPS "$3"
    expect "$1: 2 colocated ranks with LoRA finish" $?
    equivalent_lora "$1" "$2"
    out=$(same_moe "$2" "$1" 2>&1)
    expect "$1: the router's and the routing replay's metrics match one process ($out)" $?
done

# split: 2 trainer ranks in one SP (CP) group, or 4 (2 DP ranks, an EP group, of SP 2), and a rollout rank
# recording the experts (it gets each version whole, the experts gathered over EP)
for layout in "split-sp2 one 2 $SP=2" "split-cp2 whole 2 $CP=2" "split-sp2ep2 one 4 $SP=2 $EP=2" \
    "split-cp2ep2 whole 4 $CP=2 $EP=2"; do
    set -- $layout
    ref=$2-qwen3_moe
    # shellcheck disable=SC2046,SC2086
    "${MPIRUN[@]}" -np $(($3 + 1)) "$WORKER" $(common qwen3_moe) $MOE trainer.default_local_dir="$TMP/$1" "${@:4}" \
        placement.trainer_ranks="$3" placement.rollout_ranks=1 >"$TMP/$1.log" 2>&1
    expect "$1: $3 trainer ranks and a rollout rank finish" $?
    out=$(same_metrics "$ref" "$1" 2>&1) && out="$out; $(same_moe "$ref" "$1" 2>&1)" &&
        out="$out; $(same_weights "$ref" "$1")"
    expect "$1: losses, grad norms, the router's metrics and weights match one process ($out)" $?
done

# split one step off (rollout.mode=async): the rollout's router is an update behind, so at step 2 tokens route
# otherwise than the trainer's would, and the rollout's experts (sliced like the tokens) change what it computes:
# SP2 and CP2 trainers against one trainer rank
ASYNC="actor_rollout_ref.rollout.mode=async placement.rollout_ranks=1"
for layout in "async-one 1 async-one" "async-whole 1 async-whole $NOSHARE" "async-sp2 2 async-one $SP=2" \
    "async-cp2 2 async-whole $CP=2"; do
    set -- $layout
    # shellcheck disable=SC2046,SC2086
    "${MPIRUN[@]}" -np $(($2 + 1)) "$WORKER" $(common qwen3_moe) $MOE $ASYNC trainer.default_local_dir="$TMP/$1" \
        placement.trainer_ranks="$2" "${@:4}" >"$TMP/$1.log" 2>&1
    expect "$1: $2 trainer rank(s) and a rollout rank one step off finish" $?
    [ "$1" = "$3" ] && continue
    out=$(same_metrics "$3" "$1" 2>&1) && out="$out; $(same_moe "$3" "$1" 2>&1)" &&
        out="$out; $(same_weights "$3" "$1")"
    expect "$1: losses, grad norms, the router's and replay's metrics and weights match one trainer's ($out)" $?
done
python3 - "$TMP/async-sp2/p/e/metrics.jsonl" "$TMP/async-cp2/p/e/metrics.jsonl" <<'PY'
import json, sys
for p in sys.argv[1:]:
    r = [json.loads(l) for l in open(p) if json.loads(l)["step"] == 2][0]
    assert r["training/rollout_routing_mismatch"] > 0, (p, r["training/rollout_routing_mismatch"])
PY
expect "async-sp2, async-cp2: at step 2 the rollout's experts differ from the trainer's own choice" $?

grep -Eq "ZeRO-1 with EP: DP rank [0-9]+ keeps the optimizer state of [0-9]+ of this EP rank's [0-9]+ parameters \(dense ones over DP, experts over the 2 DP ranks" \
    "$TMP/sp2ep2dp2-zero1-qwen3_moe.log"
expect "sp2ep2dp2-zero1: the experts' optimizer state is sharded over the 2 ranks holding the same experts" $?
# its step-1 checkpoint (the moments gathered whole) resumes in one process, ending at the one-process weights
# shellcheck disable=SC2046,SC2086
"$WORKER" $(common qwen3_moe) $MOE trainer.default_local_dir="$TMP/zero1-to-one" trainer.resume_mode=resume_path \
    trainer.resume_from_path="$(ckpt sp2ep2dp2-zero1-qwen3_moe 1)" >"$TMP/zero1-to-one.log" 2>&1
expect "sp2ep2dp2-zero1's step-1 checkpoint resumes in one process" $?
out=$(same_weights one-qwen3_moe zero1-to-one)
expect "resumed in one process from SP2 x EP2 x DP2 with ZeRO-1: the one-process weights ($out)" $?
finish "$TMP"/*.log
