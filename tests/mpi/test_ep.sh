#!/usr/bin/env bash
# Expert parallelism (actor_rollout_ref.actor.megatron.expert_model_parallel_size) in colocated runs reproduces the
# single-process run (mpirun --oversubscribe on 2 cores), on tiny random Qwen3-MoE and Mixtral models with the
# load-balancing loss on:
#  - EP2 (2 ranks: one EP group, each rank its own data) and EP2 x DP2 (4 ranks: two EP groups of 2): per-step
#    losses, grad norms, entropies and the router's metrics (actor/moe/...), and the weights after two GRPO steps,
#    within 1e-5 relative, with the load-balancing loss on and off; so does DP4 without EP with the loss on (a rank
#    holding more of a mini-batch than another: each micro-batch's loss divided by the micro-batches of all ranks);
#  - checkpoints are whole, in the Hugging Face layout, whatever EP wrote them: EP2's step-1 checkpoint resumes in
#    one process, and one process's resumes under EP2, both ending at the single-process weights;
#  - with dynamic batch sizes (micro-batches by a token budget) the EP ranks can run different numbers of
#    micro-batches: the fewer are padded with empty ones (each layer's all-to-alls need every rank), and EP2 gives
#    DP2's run (without EP; both differ from one process there, whose micro-batches hold other sequences and so
#    another load-balancing loss); so does EP2 x PP2 against DP2 x PP2;
#  - a split run (2 trainer ranks with EP 2, a rollout rank generating with the whole model the EP group gathers
#    each step) gives the same, so does one with 4 trainer ranks at EP 2 x PP 2;
#  - tensor parallelism with experts (each expert split over TP by intermediate rows, the router whole on every TP
#    rank): TP2 (2 ranks; Qwen3-MoE and Mixtral, and Qwen3-MoE generating with the TP-split model as a rollout TP
#    group), TP2 x PP2 and EP2 x TP2 (4 ranks) colocated, and split runs of 2 TP2 and of 4 EP2 x TP2 trainer
#    ranks, match one process, with the load-balancing loss on; the TP bytes equal the planner's;
#  - expert parallelism in generation (rollout.expert_parallel_size = rollout TP: each expert whole on one rank of
#    the engine's TP group): colocated DP2 and TP2 (Qwen3-MoE, Mixtral) and a split run of a rollout TP group of 2
#    match one process;
#  - ZeRO-1 (use_distributed_optimizer) with EP: EP2 over 2 DP ranks (the dense parameters' optimizer state halved
#    over DP, each rank its experts' whole) and EP2 x DP2 (the experts' state halved too, over the 2 ranks holding the
#    same experts) give the same; EP2 x DP2's step-1 checkpoint (its moments gathered whole) resumes in one process,
#    and one process's resumes under it, both ending at the single-process weights; so do EP2 x TP2 (4 ranks: the
#    dense state halved over DP) and EP2 x TP2 x DP2 (8 ranks: the experts' state halved too), whose norm sums the
#    TP ranks' parts and counts what every TP rank holds whole (norms, the router) once, and the checkpoints move
#    between EP2 x TP2 x DP2 with ZeRO-1 and one process both ways;
#  - plain MoE (no EP) with PP 2 (one layer a stage, the load-balancing loss summed over the stages) gives the same,
#    so does EP2 x PP2 (4 ranks: each stage's MoE layer dispatches over the EP group of its stage), with and without
#    ZeRO-1 (each stage shards its own optimizer state; the tied embedding's last-stage copy counted once in the norm);
#    so does EP2 x TP2 x PP2 (8 ranks: a model copy is the stages' EP x TP ranks);
#  - layouts that do not work are refused by name: E not divisible by EP, EP on a dense model, DP not divisible by
#    EP.
# usage: test_ep.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-ep
test_env
MPIRUN=(timeout "$(scaled 300)" mpirun --oversubscribe --bind-to none)
. "$(dirname "$0")/equiv_lib.sh"
EP=actor_rollout_ref.actor.megatron.expert_model_parallel_size
AUX=actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.5
NOAUX=actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0

# colocated run: NAME MODEL RANKS [more keys...]
colo() {
    local name=$1 model=$2 ranks=$3
    shift 3
    # shellcheck disable=SC2046 # common's words are the keys
    "${MPIRUN[@]}" -np "$ranks" "$WORKER" $(common "$model") $AUX trainer.default_local_dir="$TMP/$name" \
        trainer.nnodes=1 trainer.n_gpus_per_node="$ranks" "$@" >"$TMP/$name.log" 2>&1
}
one() { # NAME MODEL [more keys...]: one process
    local name=$1 model=$2
    shift 2
    # shellcheck disable=SC2046
    "$WORKER" $(common "$model") $AUX trainer.default_local_dir="$TMP/$name" "$@" >"$TMP/$name.log" 2>&1
}
same_moe() { # A B: the router's metrics of run B against run A
    python3 - "$TMP/$1/p/e/metrics.jsonl" "$TMP/$2/p/e/metrics.jsonl" <<'PY'
import json, sys
a, b = ({r["step"]: r for r in map(json.loads, open(p)) if r["step"] >= 1} for p in sys.argv[1:3])
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
for s in a:
    for k in ("actor/moe/aux_loss", "actor/moe/load_imbalance", "actor/moe/tokens_per_expert/max",
              "actor/moe/tokens_per_expert/min"):
        x, y = a[s][k], b[s][k]
        if abs(x - y) > 1e-5 * max(abs(x), 1e-3):
            sys.exit(f"step {s} {k}: {x} against {y}")
print("same routing")
PY
}

for kind in qwen3_moe mixtral; do
    tiny_moe_model "$TMP/$kind" $kind 11
    expect "$kind: tiny model written" $?
    one "one-$kind" $kind
    expect "$kind: single-process run finishes" $?
done
one one-noaux qwen3_moe $NOAUX
expect "qwen3_moe: single-process run without the load-balancing loss finishes" $?
colo dp4 qwen3_moe 4
expect "qwen3_moe: DP4 (no EP) finishes" $?
out=$(same_metrics one-qwen3_moe dp4 2>&1) && out="$out; $(same_moe one-qwen3_moe dp4 2>&1)"
expect "qwen3_moe: DP4 with the load-balancing loss matches one process ($out)" $?

# LAYOUT RANKS MODEL REFERENCE [keys...]
for layout in "ep2 2 qwen3_moe one-qwen3_moe" "ep2 2 mixtral one-mixtral" "ep2dp2-noaux 4 qwen3_moe one-noaux $NOAUX" \
    "ep2dp2 4 qwen3_moe one-qwen3_moe"; do
    set -- $layout
    name=$1-$3 ref=$4
    colo "$name" "$3" "$2" $EP=2 "${@:5}"
    expect "$name: $2 colocated ranks with EP 2 finish" $?
    grep -q "EP rank 1 of 2: experts 2..3 of 4" "$TMP/$name.log"
    expect "$name: EP rank 1 holds experts 2 and 3" $?
    out=$(same_metrics "$ref" "$name" 2>&1)
    expect "$name: per-step losses, grad norms and entropies match $ref ($out)" $?
    out=$(same_moe "$ref" "$name" 2>&1)
    expect "$name: the router's metrics match $ref ($out)" $?
    out=$(same_weights "$ref" "$name")
    expect "$name: weights after $STEPS steps (a whole checkpoint gathered over EP) match $ref ($out)" $?
done

# tensor parallelism with experts: TP2, and EP2 x TP2 (the EP groups of each TP rank dispatching among themselves)
TP=actor_rollout_ref.actor.megatron.tensor_model_parallel_size
RTP=actor_rollout_ref.rollout.tensor_model_parallel_size
REP=actor_rollout_ref.rollout.expert_parallel_size
for layout in "tp2 qwen3_moe 2 $TP=2" "tp2 mixtral 2 $TP=2" "tp2rtp2 qwen3_moe 2 $TP=2 $RTP=2" \
    "rep2 qwen3_moe 2 $RTP=2 $REP=2" "tp2rep2 mixtral 2 $TP=2 $RTP=2 $REP=2" \
    "tp2pp2 qwen3_moe 4 $TP=2 actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2" \
    "ep2tp2 qwen3_moe 4 $EP=2 $TP=2"; do
    set -- $layout
    name=$1-$2
    colo "$name" "$2" "$3" "${@:4}"
    expect "$name: $3 colocated ranks finish" $?
    out=$(same_metrics "one-$2" "$name" 2>&1)
    expect "$name: per-step losses, grad norms and entropies match one process ($out)" $?
    out=$(same_moe "one-$2" "$name" 2>&1) # under PP summed over the stages
    expect "$name: the router's metrics match one process ($out)" $?
    out=$(same_weights "one-$2" "$name")
    expect "$name: weights after $STEPS steps (a whole checkpoint gathered over TP and EP) match one process ($out)" $?
done
grep -q "TP rank 1 of 2, stage 0 of 1: " "$TMP/tp2-qwen3_moe.log"
expect "tp2: the trainer ranks hold TP shards" $?
grep -q "weights resharded into the generation layout" "$TMP/tp2-qwen3_moe.log" &&
    ! grep -q "weights resharded into the generation layout" "$TMP/tp2rtp2-qwen3_moe.log"
expect "tp2rtp2: the TP-split policy generates itself (no resharding), tp2 reshards to whole copies" $?
grep -q "engine TP rank 1 of 2 generates with experts 2..3 of 4 whole" "$TMP/rep2-qwen3_moe.log" &&
    grep -q "engine TP rank 1 of 2 generates with experts 2..3 of 4 whole" "$TMP/tp2rep2-mixtral.log"
expect "rep2, tp2rep2: generation's experts held whole over the engine's TP group (rollout.expert_parallel_size)" $?
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 3 "$WORKER" $(common qwen3_moe) $AUX trainer.default_local_dir="$TMP/split-rep2" $RTP=2 $REP=2 \
    placement.trainer_ranks=1 placement.rollout_ranks=2 >"$TMP/split-rep2.log" 2>&1
expect "split-rep2: a trainer rank and a rollout TP group of 2 holding the experts whole finish" $?
out=$(same_metrics one-qwen3_moe split-rep2 2>&1) && out="$out; $(same_weights one-qwen3_moe split-rep2)"
expect "split-rep2: losses, grad norms and weights match one process ($out)" $?
grep -q "TP rank 1 of 2 generates with experts 2..3 of 4 whole" "$TMP/split-rep2.log"
expect "split-rep2: the rollout TP rank 1 holds experts 2 and 3 whole" $?
grep -q "EP rank 1 of 2: experts 2..3 of 4 (TP rank 1 of 2: their rows 16..31)" "$TMP/ep2tp2-qwen3_moe.log"
expect "ep2tp2: EP rank 1, TP rank 1 holds rows 16..31 of experts 2 and 3" $?
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 3 "$WORKER" $(common qwen3_moe) $AUX trainer.default_local_dir="$TMP/split-tp2" $TP=2 \
    placement.trainer_ranks=2 placement.rollout_ranks=1 >"$TMP/split-tp2.log" 2>&1
expect "split-tp2: 2 TP2 trainer ranks and a rollout rank finish" $?
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 5 "$WORKER" $(common qwen3_moe) $AUX trainer.default_local_dir="$TMP/split-ep2tp2" $EP=2 $TP=2 \
    placement.trainer_ranks=4 placement.rollout_ranks=1 >"$TMP/split-ep2tp2.log" 2>&1
expect "split-ep2tp2: 4 EP2 x TP2 trainer ranks (the EP x TP group gathers each version) and a rollout rank finish" $?
out=$(same_metrics one-qwen3_moe split-ep2tp2 2>&1) && out="$out; $(same_weights one-qwen3_moe split-ep2tp2)"
expect "split-ep2tp2: losses, grad norms and weights match one process ($out)" $?
out=$(same_metrics one-qwen3_moe split-tp2 2>&1) && out="$out; $(same_weights one-qwen3_moe split-tp2)"
expect "split-tp2: losses, grad norms and weights match one process ($out)" $?
# its TP bytes (perf/comm_bytes/tp, split runs) against the planner's, given the step's tokens: with experts each
# backward also sums the routing weights' gradients (k floats a token and layer), and each optimizer step the q/k
# norms' gradients
tokens=$(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][-1]; print(int(r['perf/forward_tokens/update']))" \
    "$TMP/split-tp2/p/e/metrics.jsonl")
"$MODEL_TOOL" plan "$TMP/qwen3_moe" --cpu --nodes 1 --gpus-per-node 2 --prompts 4 --n 4 --micro-batch 2 \
    --mini-batches 2 --no-recompute --step-tokens "$tokens" --all --bytes >"$TMP/plan-tp2.txt" 2>&1
python3 - "$TMP/plan-tp2.txt" "$TMP/split-tp2/p/e/metrics.jsonl" <<'PY'
import json, re, sys
m = re.search(r"bytes tp=2 pp=1 dp=1 zero1=0: tp (\d+) pp", open(sys.argv[1]).read())
assert m, "no TP2 line in the plan"
got, want = [json.loads(l) for l in open(sys.argv[2])][-1]["perf/comm_bytes/tp"], float(m.group(1))
assert got == want, (got, want)
print("planned", want, "= measured")
PY
expect "split-tp2: grpo-model plan's TP bytes per step equal the measured ones" $?
# ZeRO-1 with EP (dense state over DP, expert state over the ranks holding the same experts); MoE with PP, no EP
ZERO=actor_rollout_ref.actor.megatron.use_distributed_optimizer=true
PP=actor_rollout_ref.actor.megatron.pipeline_model_parallel_size
for layout in "ep2-zero1 2 $EP=2 $ZERO" "ep2dp2-zero1 4 $EP=2 $ZERO" "pp2-moe 2 $PP=2" "ep2pp2 4 $EP=2 $PP=2" \
    "ep2pp2-zero1 4 $EP=2 $PP=2 $ZERO" "ep2tp2pp2 8 $EP=2 $TP=2 $PP=2 $RTP=2" "ep2tp2-zero1 4 $EP=2 $TP=2 $ZERO" \
    "ep2tp2dp2-zero1 8 $EP=2 $TP=2 $ZERO $RTP=2"; do
    set -- $layout
    name=$1
    colo "$name" qwen3_moe "$2" "${@:3}"
    expect "$name: $2 colocated ranks finish" $?
    out=$(same_metrics one-qwen3_moe "$name" 2>&1)
    expect "$name: per-step losses, grad norms and entropies match one process ($out)" $?
    out=$(same_moe one-qwen3_moe "$name" 2>&1)
    expect "$name: the router's metrics match one process ($out)" $?
    out=$(same_weights one-qwen3_moe "$name")
    expect "$name: weights after $STEPS steps match one process ($out)" $?
done
grep -Eq "ZeRO-1 with EP: DP rank 1 keeps the optimizer state of [0-9]+ of this EP rank's [0-9]+ parameters \(dense ones over DP, experts over the 2 DP ranks" \
    "$TMP/ep2dp2-zero1.log"
expect "ep2dp2-zero1: a rank keeps a block of the dense and of its experts' optimizer state" $?
grep -Eq "ZeRO-1 with EP: DP rank 3 keeps the optimizer state of [0-9]+ of this EP rank's [0-9]+ parameters \(dense ones over DP, experts over the 2 DP ranks" \
    "$TMP/ep2tp2dp2-zero1.log"
expect "ep2tp2dp2-zero1: each TP rank's 4 DP ranks keep blocks of its dense and of its experts' optimizer state" $?
grep -Eq "EP rank 1 of 2: experts 2\.\.3 of 4 \(TP rank 0 of 1: their rows [0-9.]+\), stage 1 of 2 \(layers 1\.\.1\)" "$TMP/ep2pp2.log"
expect "ep2pp2: EP rank 1 of the second stage holds experts 2 and 3 of layer 1" $?
python3 - "$TMP/ep2pp2/p/e/metrics.jsonl" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r["step"] >= 1]
assert rows and all(r["perf/comm_bytes/ep"] > 0 for r in rows), rows
PY
expect "ep2pp2: the stages' MoE layers sent their tokens over EP (perf/comm_bytes/ep)" $?

# dynamic batch sizes: unequal micro-batch counts on the EP ranks, padded
DYN="actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=60"
colo dp2-dyn qwen3_moe 2 $DYN
expect "dp2-dyn: DP2 (no EP) with dynamic batch sizes finishes" $?
colo ep2-dyn qwen3_moe 2 $EP=2 $DYN trainer.log_level=debug
expect "ep2-dyn: EP2 with dynamic batch sizes finishes" $?
grep -Eq "EP rank [01]: [0-9]+ micro-batch\(es\), padded to the EP group's [0-9]+ with empty ones" "$TMP/ep2-dyn.log"
expect "ep2-dyn: an EP rank with fewer micro-batches ran empty ones" $?
out=$(same_metrics dp2-dyn ep2-dyn 2>&1) && out="$out; $(same_weights dp2-dyn ep2-dyn)"
expect "ep2-dyn: losses, grad norms and weights match DP2's ($out)" $?
colo dp2pp2-dyn qwen3_moe 4 $PP=2 $DYN
expect "dp2pp2-dyn: DP2 x PP2 (no EP) with dynamic batch sizes finishes" $?
colo ep2pp2-dyn qwen3_moe 4 $EP=2 $PP=2 $DYN trainer.log_level=debug
expect "ep2pp2-dyn: EP2 x PP2 with dynamic batch sizes finishes" $?
grep -Eq "EP rank [01]: [0-9]+ micro-batch\(es\), padded to the EP group's [0-9]+ with empty ones" "$TMP/ep2pp2-dyn.log"
expect "ep2pp2-dyn: an EP rank with fewer micro-batches ran empty ones through its pipeline" $?
out=$(same_metrics dp2pp2-dyn ep2pp2-dyn 2>&1) && out="$out; $(same_weights dp2pp2-dyn ep2pp2-dyn)"
expect "ep2pp2-dyn: losses, grad norms and weights match DP2 x PP2's ($out)" $?

# a split run: 2 EP trainer ranks and a rollout rank, which gets each version whole (the experts gathered over EP)
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 3 "$WORKER" $(common qwen3_moe) $AUX trainer.default_local_dir="$TMP/split-ep2" $EP=2 \
    placement.trainer_ranks=2 placement.rollout_ranks=1 >"$TMP/split-ep2.log" 2>&1
expect "split-ep2: 2 trainer ranks with EP 2 and a rollout rank finish" $?
out=$(same_metrics one-qwen3_moe split-ep2 2>&1)
expect "split-ep2: per-step losses, grad norms and entropies match one process ($out)" $?
out=$(same_weights one-qwen3_moe split-ep2)
expect "split-ep2: weights after $STEPS steps match one process ($out)" $?
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 5 "$WORKER" $(common qwen3_moe) $AUX trainer.default_local_dir="$TMP/split-ep2pp2" $EP=2 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 placement.trainer_ranks=4 \
    placement.rollout_ranks=1 >"$TMP/split-ep2pp2.log" 2>&1
expect "split-ep2pp2: 4 trainer ranks with EP 2 x PP 2 and a rollout rank finish" $?
out=$(same_metrics one-qwen3_moe split-ep2pp2 2>&1) && out="$out; $(same_weights one-qwen3_moe split-ep2pp2)"
expect "split-ep2pp2: losses, grad norms and weights (each version gathered over the stages' EP groups) match one process ($out)" $?

python3 - "$TMP/ep2-qwen3_moe/p/e/metrics.jsonl" "$TMP/dp4/p/e/metrics.jsonl" <<'PY'
import json, sys
ep, dp = ([r for r in map(json.loads, open(p)) if r["step"] >= 1] for p in sys.argv[1:3])
assert ep and all(r["perf/comm_bytes/ep"] > 0 and r["perf/comm_bytes/ep"] % (4 * 64) == 0 for r in ep), ep
assert all("perf/comm_bytes/ep" not in r for r in dp)
PY
expect "perf/comm_bytes/ep: the all-to-all bytes of each EP step, whole hidden rows of 4 bytes; absent without EP" $?

# checkpoints: whole, in the Hugging Face layout, whatever EP wrote them
python3 - "$(ckpt ep2-qwen3_moe 2)/actor/model.safetensors" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    keys = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
for l in (0, 1):
    for e in range(4):
        for p in ("gate_proj", "up_proj", "down_proj"):
            assert f"model.layers.{l}.mlp.experts.{e}.{p}.weight" in keys, (l, e, p)
PY
expect "EP2's checkpoint holds every expert in the Hugging Face layout" $?
RESUME=trainer.resume_mode=resume_path
one ep2-to-one qwen3_moe $RESUME trainer.resume_from_path="$(ckpt ep2-qwen3_moe 1)"
expect "EP2's step-1 checkpoint resumes in one process" $?
out=$(same_weights one-qwen3_moe ep2-to-one)
expect "resumed in one process from EP2: the single-process weights ($out)" $?
colo one-to-ep2 qwen3_moe 2 $EP=2 $RESUME trainer.resume_from_path="$(ckpt one-qwen3_moe 1)"
expect "one process's step-1 checkpoint resumes under EP2" $?
out=$(same_weights one-qwen3_moe one-to-ep2)
expect "resumed under EP2 from one process: the single-process weights ($out)" $?
one zero1-to-one qwen3_moe $RESUME trainer.resume_from_path="$(ckpt ep2dp2-zero1 1)"
expect "EP2 x DP2 with ZeRO-1: its step-1 checkpoint resumes in one process" $?
out=$(same_weights one-qwen3_moe zero1-to-one)
expect "resumed in one process from EP2 x DP2 with ZeRO-1 (the moments gathered whole): the single-process weights ($out)" $?
one pp-zero1-to-one qwen3_moe $RESUME trainer.resume_from_path="$(ckpt ep2pp2-zero1 1)"
expect "EP2 x PP2 with ZeRO-1: its step-1 checkpoint resumes in one process" $?
out=$(same_weights one-qwen3_moe pp-zero1-to-one)
expect "resumed in one process from EP2 x PP2 with ZeRO-1 (the stages' moments gathered whole): the single-process weights ($out)" $?
one tp-zero1-to-one qwen3_moe $RESUME trainer.resume_from_path="$(ckpt ep2tp2dp2-zero1 1)"
expect "EP2 x TP2 x DP2 with ZeRO-1: its step-1 checkpoint resumes in one process" $?
out=$(same_weights one-qwen3_moe tp-zero1-to-one)
expect "resumed in one process from EP2 x TP2 x DP2 with ZeRO-1 (the moments gathered over DP, then TP and EP): the single-process weights ($out)" $?
colo one-to-tp-zero1 qwen3_moe 8 $EP=2 $TP=2 $ZERO $RTP=2 $RESUME trainer.resume_from_path="$(ckpt one-qwen3_moe 1)"
expect "one process's step-1 checkpoint resumes under EP2 x TP2 x DP2 with ZeRO-1" $?
out=$(same_weights one-qwen3_moe one-to-tp-zero1)
expect "resumed under EP2 x TP2 x DP2 with ZeRO-1 from one process: the single-process weights ($out)" $?
colo one-to-zero1 qwen3_moe 4 $EP=2 $ZERO $RESUME trainer.resume_from_path="$(ckpt one-qwen3_moe 1)"
expect "one process's step-1 checkpoint resumes under EP2 x DP2 with ZeRO-1" $?
out=$(same_weights one-qwen3_moe one-to-zero1)
expect "resumed under EP2 x DP2 with ZeRO-1 from one process: the single-process weights ($out)" $?

# refusals, by name
refused() { # NAME TEXT RANKS MODEL [keys...]
    local name=$1 text=$2 ranks=$3 model=$4
    shift 4
    # shellcheck disable=SC2046
    "${MPIRUN[@]}" -np "$ranks" "$WORKER" $(common "$model") trainer.default_local_dir="$TMP/$name" \
        trainer.total_training_steps=1 "$@" >"$TMP/$name.out" 2>&1
    local rc=$?
    [ "$rc" -ne 0 ] && says "$TMP/$name.out" "$text"
    expect "$name: refused ($rc), naming the key and numbers" $?
}
refused ep4-of-3 "expert_model_parallel_size (3) does not divide the model's num_experts (4)" 3 qwen3_moe $EP=3
refused ep-dense "expert_model_parallel_size (2): the model is dense" 2 llama $EP=2
refused ep-dp3 "data-parallel ranks are not a multiple of actor_rollout_ref.actor.megatron.expert_model_parallel_size 2" \
    3 qwen3_moe $EP=2
finish "$TMP"/*.log
