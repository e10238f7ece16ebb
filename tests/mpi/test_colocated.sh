#!/usr/bin/env bash
# Colocated ranks (verl's hybrid engine: no rollout split, every rank generates its share of the step, then all
# train) reproduce the single-process run (mpirun --oversubscribe on 2 cores):
#  - tiny Llama, Qwen2 and Qwen3, each under DP2, TP2, PP2, TP2 x PP2, DP2 x TP2 with ZeRO-1, and with a rollout
#    TP other than the training TP (DP2 training generating as one TP2 engine; TP2 training generating with whole
#    layers on each rank; TP2 training generating in place as one TP2 engine; DP2 x TP2 training generating as one
#    TP4 engine across both model copies): per-step losses, grad norms and
#    entropies, and the weights after two GRPO steps, within 1e-5 relative;
#  - validation shared by the engines, with one process's rewards; trainer.validation_data_dir's file (rank 0 writes
#    every engine's responses) is one process's;
#  - the weights resharded into the generation layout, bytes and time logged (timing_s/update_weights,
#    perf/update_weights_bytes: the whole model gathered and broadcast over a model copy, nothing where the
#    layouts agree);
#  - checkpoints move between layouts: colocated -> one process, one process -> colocated, colocated -> split,
#    split -> colocated, each ending at the single-process weights;
#  - DAPO's dynamic sampling (algorithm.filter_groups) draws the rounds one process draws, with its results, also
#    with rounds of data.gen_batch_size prompts (verl's DAPO recipe); with rollout ranks that key is refused by name;
#  - work stealing on and off train on the same batch (same weights), and the ranks' idle share is measured;
#  - memory phases: generation holds no gradients or training buffers, the update no KV cache
#    (actor_rollout_ref.rollout.free_cache_engine), each phase's peak logged;
#  - -np that disagrees with trainer.nnodes x trainer.n_gpus_per_node is an error naming the keys and numbers;
#  - trainer.survive_trainer_loss is refused on this MPI (no ULFM), naming the key.
# usage: test_colocated.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-colo
test_env
MPIRUN=(timeout "$(scaled 300)" mpirun --oversubscribe --bind-to none)
. "$(dirname "$0")/equiv_lib.sh"

# colocated run: NAME MODEL RANKS TP PP [more keys...]: verl's trainer.nnodes x n_gpus_per_node and no rollout.*
colo() {
    local name=$1 model=$2 ranks=$3 tp=$4 pp=$5
    shift 5
    # shellcheck disable=SC2046 # common's words are the keys
    "${MPIRUN[@]}" -np "$ranks" "$WORKER" $(common "$model") trainer.default_local_dir="$TMP/$name" \
        trainer.nnodes=1 trainer.n_gpus_per_node="$ranks" \
        actor_rollout_ref.actor.megatron.tensor_model_parallel_size="$tp" \
        actor_rollout_ref.actor.megatron.pipeline_model_parallel_size="$pp" trainer.validation_data_dir="$TMP/$name/val" \
        "$@" >"$TMP/$name.log" 2>&1
}
metric() { python3 -c "import json,sys; print(max(r.get(sys.argv[2], -1) for r in map(json.loads, open(sys.argv[1]))))" \
    "$TMP/$1/p/e/metrics.jsonl" "$2"; }
equivalent() { # NAME MODEL: the run against one process
    local out
    out=$(same_metrics "one-$2" "$1" 2>&1)
    expect "$1: per-step losses, grad norms and entropies match one process ($out)" $?
    out=$(same_weights "one-$2" "$1")
    expect "$1: weights after $STEPS steps match one process within 1e-5 ($out)" $?
}

for model in llama qwen2 qwen3; do
    # shellcheck disable=SC2046
    "$WORKER" $(common $model) trainer.default_local_dir="$TMP/one-$model" \
        trainer.validation_data_dir="$TMP/one-$model/val" >"$TMP/one-$model.log" 2>&1
    expect "$model: single-process run finishes" $?
done

RTP=actor_rollout_ref.rollout.tensor_model_parallel_size
ZERO=actor_rollout_ref.actor.megatron.use_distributed_optimizer=true
LAYOUTS=("dp2 2 1 1" "tp2 2 2 1" "pp2 2 1 2" "tp2pp2 4 2 2" "zero-dp2tp2 4 2 1 $ZERO" "dp2-rtp2 2 1 1 $RTP=2"
    "tp2-rtp2 2 2 1 $RTP=2" "dp2tp2-rtp4 4 2 1 $RTP=4")
ALL=()
for model in llama qwen2 qwen3; do
    for layout in "${LAYOUTS[@]}"; do
        set -- $layout
        ALL+=("$1 $model ${*:2}")
    done
done
for layout in "${ALL[@]}"; do
    set -- $layout
    name=$1-$2
    colo "$name" "$2" "$3" "$4" "$5" "${@:6}"
    expect "$name: $3 colocated ranks (TP $4, PP $5${6:+, $6}) finish" $?
    equivalent "$name" "$2"
done
python3 - "$TMP/dp2-llama/p/e/metrics.jsonl" <<'PY'
import json, sys
v = [r for r in map(json.loads, open(sys.argv[1])) if "val-core/arithmetic/reward/mean@1" in r]
assert [r["step"] for r in v] == [0, 2] and all(r["timing_s/testing"] > 0 for r in v), v
print("ok")
PY
expect "validation shared by the engines (two chunks of data.val_batch_size 2) at steps 0 and 2, the same rewards as one process" $?
# trainer.validation_data_dir (verl's dump): rank 0 writes every engine's responses, in one process's order; before
# training (the same weights) the file is one process's byte for byte; each line's score makes the logged mean
python3 - "$TMP/one-llama" "$TMP/dp2-llama" <<'PY'
import json, sys
one, dp2 = sys.argv[1], sys.argv[2]
assert open(f"{dp2}/val/0.jsonl", "rb").read() == open(f"{one}/val/0.jsonl", "rb").read(), "step 0 dumps differ"
for run in (one, dp2):
    logged = {r["step"]: r for r in map(json.loads, open(f"{run}/p/e/metrics.jsonl")) if "val-core/arithmetic/reward/mean@1" in r}
    for step in (0, 2):
        lines = [json.loads(l) for l in open(f"{run}/val/{step}.jsonl")]
        assert len(lines) == 4 and all(x["step"] == step and x["data_source"] == "arithmetic" for x in lines), lines
        assert all(set(x) >= {"input", "output", "gts", "score", "step"} for x in lines), lines[0]
        mean = sum(x["score"] for x in lines) / len(lines)
        assert abs(mean - logged[step]["val-core/arithmetic/reward/mean@1"]) < 1e-9, (run, step, mean, logged[step])
a, b = ([json.loads(l) for l in open(f"{r}/val/2.jsonl")] for r in (one, dp2))
assert [(x["input"], x["gts"]) for x in a] == [(x["input"], x["gts"]) for x in b], "step 2: prompts out of order"
print("ok")
PY
expect "validation_data_dir: rank 0 writes both engines' responses in one process's order (step 0: one process's file), each score in the logged mean" $?
# trainer.val_only on a copy of the DP2 run's directory: it resumes at step 2, validates on both engines and trains
# nothing; its file is the run's own step-2 validation, byte for byte
cp -r "$TMP/dp2-llama" "$TMP/dp2-valonly" && rm -r "$TMP/dp2-valonly/val" &&
    colo dp2-valonly llama 2 1 1 trainer.val_only=true trainer.total_training_steps=$((STEPS + 2)) &&
    cmp -s "$TMP/dp2-llama/val/$STEPS.jsonl" "$TMP/dp2-valonly/val/$STEPS.jsonl" &&
    [ -z "$(find "$TMP/dp2-valonly" -name "global_step_$((STEPS + 1))")" ]
expect "val_only on 2 colocated ranks: the checkpoint's validation again, byte for byte, and no step trained" $?
grep -q "2 colocated ranks: training DP 2 x TP 1 x PP 1; generating in 2 engine(s) of 1 rank(s)" "$TMP/dp2-llama.log" &&
    grep -q "generation uses the training weights in place" "$TMP/dp2-llama.log"
expect "DP2: two engines of one rank, generating with the training weights in place" $?
grep -q "generating in 1 engine(s) of 2 rank(s).*resharded into the generation layout" "$TMP/dp2-rtp2-llama.log"
expect "DP2 with rollout TP2: one engine of two ranks, the weights resharded each step" $?
grep -q "generating in 1 engine(s) of 2 rank(s).*in place" "$TMP/tp2-rtp2-llama.log"
expect "TP2 with rollout TP2: the TP group generates in place" $?
grep -Eq "weights resharded into the generation layout \(TP 1, whole layers\): [1-9][0-9]* bytes sent over the model copy in buckets of [0-9]+ MB" \
    "$TMP/tp2-llama.log"
expect "TP2 training, rollout TP 1: the reshard into whole layers logged with bytes, buckets and time" $?
# bytes: TP2 (rollout TP 1) gathers the whole model on the copy's first rank (its peer's shard) and broadcasts it
python3 - "$TMP/tp2-llama/p/e/metrics.jsonl" "$TMP/dp2-llama/p/e/metrics.jsonl" "$TMP/dp2-rtp2-llama/p/e/metrics.jsonl" <<'PY'
import json, sys
tp2, dp2, dp2rtp2 = ([r for r in map(json.loads, open(p)) if r["step"] >= 1] for p in sys.argv[1:4])
for r in tp2:  # step 1's weights went in for the validation before training; step 2 reshards step 1's update
    if r["step"] == 1:
        assert r["perf/update_weights_bytes"] == 0, r
    else:
        assert r["perf/update_weights_bytes"] > 0 and r["timing_s/update_weights"] > 0, r
for r in dp2 + dp2rtp2:  # the layouts agree, or each rank slices its own whole copy: nothing moves
    assert r["perf/update_weights_bytes"] == 0, r
for r in tp2 + dp2 + dp2rtp2:
    assert 0 <= r["perf/idle_ratio/max"] <= 1 and r["colocated/units"] >= 2, r
print("ok")
PY
expect "update_weights bytes and time logged where the layouts differ, none where they agree; idle per rank" $?

# checkpoints across layouts (step 1's, resumed to step 2 and the single-process weights)
RESUME=trainer.resume_mode=resume_path
split2() { # NAME [keys...]: 1 trainer + 1 rollout rank
    local name=$1
    shift
    # shellcheck disable=SC2046
    "${MPIRUN[@]}" -np 2 "$WORKER" $(common llama) trainer.default_local_dir="$TMP/$name" \
        placement.trainer_ranks=1 placement.rollout_ranks=1 "$@" >"$TMP/$name.log" 2>&1
}
# shellcheck disable=SC2046
"$WORKER" $(common llama) trainer.default_local_dir="$TMP/c2one" $RESUME \
    trainer.resume_from_path="$(ckpt tp2pp2-llama 1)" >"$TMP/c2one.log" 2>&1
expect "a colocated TP2 x PP2 checkpoint resumes in one process" $?
out=$(same_weights one-llama c2one)
expect "... and ends at the single-process weights ($out)" $?
colo one2c llama 2 1 1 $RESUME trainer.resume_from_path="$(ckpt one-llama 1)"
expect "a single-process checkpoint resumes on 2 colocated ranks" $?
out=$(same_weights one-llama one2c)
expect "... and ends at the single-process weights ($out)" $?
split2 c2split $RESUME trainer.resume_from_path="$(ckpt dp2-llama 1)"
expect "a colocated DP2 checkpoint resumes split (1 trainer + 1 rollout rank)" $?
out=$(same_weights one-llama c2split)
expect "... and ends at the single-process weights ($out)" $?
split2 split
expect "a split run (1 trainer + 1 rollout rank) finishes" $?
colo split2c llama 2 2 1 $RESUME trainer.resume_from_path="$(ckpt split 1)"
expect "a split checkpoint resumes on 2 colocated ranks under TP2" $?
out=$(same_weights one-llama split2c)
expect "... and ends at the single-process weights ($out)" $?

# the long tail: with stealing off each engine makes only its own units; the batch is the same
colo nosteal llama 2 1 1 placement.colocated_steal=false placement.colocated_units=4
expect "DP2 with work stealing off finishes" $?
equivalent nosteal llama
[ "$(metric nosteal colocated/units_stolen)" = 0.0 ] || [ "$(metric nosteal colocated/units_stolen)" = 0 ]
expect "... and no unit was made by another engine" $?

# memory phases: generation runs without the gradients and the training buffers, the update without KV caches;
# keeping them (free_cache_engine=false) trains the same weights with more memory held during generation
colo keep llama 2 1 1 actor_rollout_ref.rollout.free_cache_engine=false
expect "DP2 with actor_rollout_ref.rollout.free_cache_engine=false finishes" $?
"$COMPARE" "$(ckpt dp2-llama $STEPS)/actor" "$(ckpt keep $STEPS)/actor" 0 >/dev/null 2>&1
expect "... with the same weights, bit for bit, as when each phase gives its memory back" $?
python3 - "$TMP/dp2-llama/p/e/metrics.jsonl" "$TMP/keep/p/e/metrics.jsonl" <<'PY'
import json, sys
free, keep = ([r for r in map(json.loads, open(p)) if r["step"] >= 1] for p in sys.argv[1:3])
for f, k in zip(free, keep):
    grads = k["perf/max_memory_gb/gen/gradients"]
    assert f["perf/max_memory_gb/gen/gradients"] == 0 and grads > 0, (f, k)
    assert f["perf/max_memory_gb/update/kv_cache"] == 0 == k["perf/max_memory_gb/update/kv_cache"], (f, k)
    if f["step"] >= 2:  # once a step has trained, generation without its buffers holds less by the gradients
        assert f["perf/max_memory_allocated_gb/gen"] <= k["perf/max_memory_allocated_gb/gen"] - grads, (f, k)
    assert f["perf/max_memory_allocated_gb"] == max(f["perf/max_memory_allocated_gb/gen"],
                                                      f["perf/max_memory_allocated_gb/update"]), f
print("ok")
PY
expect "generation holds no gradients, the update no KV cache; per-phase peaks logged" $?

# DAPO's dynamic sampling: rounds of generation until enough groups carry a signal, as one process draws them
# (length_score: most groups of 12-token responses score alike, so steps take 2 or 3 rounds)
DAPO=(algorithm.filter_groups.enable=true algorithm.filter_groups.max_num_gen_batches=3
    custom_reward_function.name=length_score)
# shellcheck disable=SC2046
"$WORKER" $(common llama) trainer.default_local_dir="$TMP/one-dapo" "${DAPO[@]}" >"$TMP/one-dapo.log" 2>&1
expect "one process with algorithm.filter_groups.enable finishes" $?
for layout in "dp2 2 1 1" "tp2 2 2 1"; do
    set -- $layout
    colo "dapo-$1" llama "$2" "$3" "$4" "${DAPO[@]}"
    expect "DAPO on 2 colocated ranks ($1) finishes" $?
    out=$(same_metrics one-dapo "dapo-$1" 2>&1)
    expect "... per-step losses, grad norms and entropies match one process ($out)" $?
    out=$(same_weights one-dapo "dapo-$1")
    expect "... weights match one process within 1e-5 ($out)" $?
done
python3 - "$TMP/one-dapo/p/e/metrics.jsonl" "$TMP/dapo-dp2/p/e/metrics.jsonl" <<'PY'
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if r["step"] >= 1] for p in sys.argv[1:3])
rounds = [r["train/num_gen_batches"] for r in a]
assert rounds == [r["train/num_gen_batches"] for r in b] and max(rounds) > 1, rounds
assert [r["train/num_kept_groups"] for r in a] == [r["train/num_kept_groups"] for r in b]
print(rounds)
PY
expect "... with the same rounds of generation per step, more than one where groups scored alike" $?

# DAPO as verl's recipe runs it: rounds of data.gen_batch_size prompts (6, the step keeps 4 groups), drawn and made
# by the colocated engines as one process draws and makes them
GEN=("${DAPO[@]}" data.gen_batch_size=6)
# shellcheck disable=SC2046
"$WORKER" $(common llama) trainer.default_local_dir="$TMP/one-dapo-gen" "${GEN[@]}" >"$TMP/one-dapo-gen.log" 2>&1
expect "one process with data.gen_batch_size=6 finishes" $?
colo dapo-gen-dp2 llama 2 1 1 "${GEN[@]}"
expect "DAPO with data.gen_batch_size=6 on 2 colocated ranks (dp2) finishes" $?
out=$(same_metrics one-dapo-gen dapo-gen-dp2 2>&1)
expect "... per-step losses, grad norms and entropies match one process ($out)" $?
out=$(same_weights one-dapo-gen dapo-gen-dp2)
expect "... weights match one process within 1e-5 ($out)" $?
python3 - "$TMP/one-dapo-gen/p/e/metrics.jsonl" "$TMP/dapo-gen-dp2/p/e/metrics.jsonl" <<'PY'
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if r["step"] >= 1] for p in sys.argv[1:3])
assert len(a) == 2, a
for k in ("train/num_gen_batches", "train/num_kept_groups"):
    assert [r[k] for r in a] == [r[k] for r in b], (k, a, b)
assert all(r["train/num_kept_groups"] <= 4 for r in a), a
print([r["train/num_gen_batches"] for r in a], [r["train/num_kept_groups"] for r in a])
PY
expect "... with the same rounds of 6 prompts and kept groups per step" $?
# with separate rollout ranks the dispatcher draws one round a step: refused naming the key and the layout
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 2 "$WORKER" $(common llama) trainer.default_local_dir="$TMP/bad-gen" placement.trainer_ranks=1 \
    placement.rollout_ranks=1 "${GEN[@]}" >"$TMP/bad-gen.log" 2>&1
[ $? -ne 0 ] && says "$TMP/bad-gen.log" "data.gen_batch_size=6 (other than data.train_batch_size=4) runs in one process and on colocated ranks (placement.rollout_ranks=0); with 1 separate rollout ranks"
expect "data.gen_batch_size with separate rollout ranks is refused naming the key and the layout" $?

# -np against verl's keys
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 2 "$WORKER" $(common llama) trainer.default_local_dir="$TMP/bad" trainer.nnodes=1 \
    trainer.n_gpus_per_node=4 >"$TMP/bad.log" 2>&1
[ $? -ne 0 ] && says "$TMP/bad.log" "trainer.nnodes x trainer.n_gpus_per_node (placement.trainer_ranks) is 4 with no rollout ranks (every rank colocated), but mpirun started 2 ranks"
expect "-np 2 with trainer.n_gpus_per_node=4 is refused naming the keys and the numbers" $?

# trainer-loss survival needs Open MPI 5 with ULFM (tests/ft/test_survive.sh runs it there): this MPI is refused
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 2 "$WORKER" $(common llama) trainer.default_local_dir="$TMP/survive" trainer.nnodes=1 \
    trainer.n_gpus_per_node=2 trainer.survive_trainer_loss=true >"$TMP/survive.log" 2>&1
[ $? -ne 0 ] && says "$TMP/survive.log" "trainer.survive_trainer_loss: this build's MPI has no ULFM"
expect "trainer.survive_trainer_loss on an MPI without ULFM is refused naming the key" $?
finish "$TMP"/*.log
