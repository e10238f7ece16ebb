#!/usr/bin/env bash
# Trainer-loss survival's cost and recovery time (trainer.survive_trainer_loss; docs/scaling.md, "Trainer-loss
# survival"), on build-ft's worker under scripts/mpirun_ft: 3 colocated plain-DP ranks, one thread each, on a random
# Llama of HIDDEN x LAYERS (byte-level tokenizer) that this script makes.
#  - the normal step with the key off and on, ROUNDS runs of each in turn (the key keeps each step's start: a copy of
#    the weights and AdamW's moments): the mean of timing_s/step over the steps after the first, and on / off;
#  - with SPARE=1, a third run each round: the key on and a spare rank beside the 3 (trainer.survive_spare_ranks=1,
#    4 ranks; it waits outside every collective of a step): its mean, and spare / on;
#  - one run with the key on whose rank 2 is SIGKILLed at step 3 after its generation (the tests' hold,
#    GRPO_TEST_KILL_AT): the kill to the end of the redone step (from the log's time stamp), what rank 0 logs (the
#    loss found to the redone step's end, and the re-forming alone), and step 3's time against step 2's; with
#    SPARE=1 the same with a spare that takes rank 2's place (the re-forming then includes the state's broadcast).
#
#   bench/run_survive_bench.sh                         # HIDDEN=256 LAYERS=4 STEPS=6 ROUNDS=3
#   HIDDEN=512 LAYERS=8 bench/run_survive_bench.sh
#   SPARE=1 bench/run_survive_bench.sh                 # the rounds with an idle spare too
#   DEMO=1 bench/run_survive_bench.sh                  # the demo model (134.5 M parameters) on 2 colocated ranks,
#                                                      # 4 prompts x 2 responses of up to 32 tokens (rank 1 killed)
#   DEMO=1 KEYS="actor_rollout_ref.rollout.n=8 data.max_response_length=24" bench/run_survive_bench.sh
#                                                      # KEYS: more keys for every run (here the demo's own batch)
#   SPLIT=1 bench/run_survive_bench.sh                 # a split run: 3 trainers and 1 rollout rank (the key makes
#                                                      # the rollout rank send whole units to the lead, which hands
#                                                      # them out); the killed run loses trainer rank 1 in step 3's
#                                                      # all-reduce
#
# Results: $OUT (default build-ft/bench-results/survive-<time>/): the runs, their logs and summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
HIDDEN="${HIDDEN:-256}" LAYERS="${LAYERS:-4}" STEPS="${STEPS:-6}" ROUNDS="${ROUNDS:-3}"
B="${GRPO_FT_BUILD:-$PWD/build-ft}"
OUT="${OUT:-$B/bench-results/survive-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export GRPO_FT_BUILD="$B"
scripts/mpirun_ft --prefix-only >/dev/null # Open MPI 5 there (installed on first use)
ninja -C "$B" ${GRPO_BUILD_JOBS:+-j "$GRPO_BUILD_JOBS"} worker/grpo-worker worker/grpo-model \
    worker/rewards/reward_test_scorer.so >&2
TOK=tests/fixtures/tokenizers/bytes-chatml
python3 - "$TOK/config.json" "$OUT/config.json" "$HIDDEN" "$LAYERS" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
h, l = int(sys.argv[3]), int(sys.argv[4])
c.update(hidden_size=h, intermediate_size=3 * h, num_hidden_layers=l, num_attention_heads=max(4, h // 64),
         num_key_value_heads=max(2, h // 128))
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
"$B/worker/grpo-model" init "$OUT/config.json" "$OUT/model" --tokenizer-from "$TOK" --seed 11 --std 0.02 \
    >"$OUT/init.log" 2>&1
MODEL="$OUT/model" SIZE="6 prompts x 4 responses" MODEL_TEXT="random Llama $HIDDEN x $LAYERS"
[ -z "${KEYS:-}" ] || SIZE_KEYS=" (with $KEYS)"
keys() { # NAME
    if [ "${DEMO:-0}" = 1 ]; then
        echo actor_rollout_ref.model.path="$MODEL" trainer.project_name=p trainer.experiment_name=e \
            trainer.total_training_steps="$STEPS" trainer.val_before_train=false trainer.test_freq=-1 \
            trainer.save_freq=-1 data.train_batch_size=4 actor_rollout_ref.rollout.n=2 data.max_response_length=32 \
            data.synthetic.num_val=8 trainer.nnodes=1 trainer.n_gpus_per_node=2 trainer.default_local_dir="$OUT/$1"
        return
    fi
    echo actor_rollout_ref.model.path="$MODEL" trainer.project_name=p trainer.experiment_name=e \
        trainer.total_training_steps="$STEPS" trainer.val_before_train=false trainer.test_freq=-1 \
        trainer.save_freq=-1 data.train_batch_size=6 actor_rollout_ref.rollout.n=4 \
        actor_rollout_ref.actor.ppo_mini_batch_size=3 data.max_response_length=16 \
        data.synthetic.num_train=256 custom_reward_function.path="$B/worker/rewards/reward_test_scorer.so" \
        custom_reward_function.name=byte_score actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
        trainer.nnodes=1 trainer.n_gpus_per_node=3 trainer.default_local_dir="$OUT/$1"
}
MPI_EXTRA=()
LAYOUT=() BASE_NP=3 KILL=gen:3:2 LAYOUT_TEXT="3 colocated ranks (plain DP)"
if [ "${DEMO:-0}" = 1 ]; then # the bundled model, its own tokenizer; 2 colocated ranks, rank 1 killed
    . scripts/blas_env.sh
    MODEL="$(bench/demo_model_hf.sh)" SIZE="4 prompts x 2 responses" MODEL_TEXT="the demo model"
    BASE_NP=2 KILL=gen:3:1 LAYOUT_TEXT="2 colocated ranks (plain DP)"
fi
if [ "${SPLIT:-0}" = 1 ]; then # the 3 trainers and a rollout rank; a trainer's kill point is in its update
    LAYOUT=(placement.trainer_ranks=3 placement.rollout_ranks=1) BASE_NP=4 KILL=allreduce:3:1
    LAYOUT_TEXT="a split run of 3 trainer ranks (plain DP) and 1 rollout rank"
fi
run() { # NAME [keys...] (mpirun's options in MPI_EXTRA, the ranks in NP: 3, or 4 with SPLIT=1)
    local name=$1
    shift
    # shellcheck disable=SC2046,SC2086 # keys' words are the keys
    scripts/mpirun_ft --oversubscribe --bind-to none "${MPI_EXTRA[@]}" -np "${NP:-$BASE_NP}" grpo-worker \
        $(keys "$name") ${KEYS:-} "${LAYOUT[@]}" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    rm -rf "$OUT/$name/p/e/checkpoints" # the final checkpoint (1.6 GB a run on the demo model), read by nothing here
    return $rc
}
# mean timing_s/step over the steps after the first
step_mean() {
    python3 -c 'import json, sys
s = [r["timing_s/step"] for r in map(json.loads, open(sys.argv[1])) if r["step"] > 1 and "timing_s/step" in r]
print(f"{sum(s) / len(s):.4f}")' "$OUT/$1/p/e/metrics.jsonl"
}
off=() on=() spare=()
for r in $(seq 1 "$ROUNDS"); do
    echo "[bench] round $r: key off, then on" >&2
    run "off$r"
    off+=("$(step_mean "off$r")")
    run "on$r" trainer.survive_trainer_loss=true
    on+=("$(step_mean "on$r")")
    if [ "${SPARE:-0}" = 1 ]; then
        NP=4 run "spare$r" trainer.survive_trainer_loss=true trainer.survive_spare_ranks=1
        spare+=("$(step_mean "spare$r")")
    fi
done
# killed NAME [keys...]: a run with the key on whose rank 2 is SIGKILLed at step 3 after its generation; T0 the kill
killed() {
    local name=$1 hold="$OUT/hold-$1" job
    shift
    touch "$hold"
    MPI_EXTRA=(-x GRPO_TEST_KILL_AT -x GRPO_TEST_HOLD_FILE)
    GRPO_TEST_KILL_AT="$KILL" GRPO_TEST_HOLD_FILE="$hold" run "$name" trainer.survive_trainer_loss=true "$@" &
    job=$!
    for _ in $(seq 1 3000); do # the hold, or the run's end (at most 5 minutes)
        [ -s "$hold.held" ] || ! kill -0 "$job" 2>/dev/null && break
        sleep 0.1 # sleep-ok: the poll interval of a bounded wait
    done
    T0="$(date -u +%s.%N)"
    kill -9 "$(cat "$hold.held")"
    wait "$job"
    rm -f "$hold"
    MPI_EXTRA=()
}
echo "[bench] a run with a rank killed at step 3 ($KILL)" >&2
killed killed
t0="$T0" t0s=""
if [ "${SPARE:-0}" = 1 ]; then
    echo "[bench] the same with a spare rank, which takes rank 2's place" >&2
    NP=4 killed killed-spare trainer.survive_spare_ranks=1
    t0s="$T0"
fi
python3 - "$OUT" "$t0" "$MODEL_TEXT" "$SIZE${SIZE_KEYS:-}" "$STEPS" "${off[*]}" "${on[*]}" "${spare[*]}" "$t0s" "$LAYOUT_TEXT" \
    "$KILL" "$([ "${SPLIT:-0}" = 1 ] && echo 3 || echo "$BASE_NP")" <<'PY' | tee "$OUT/summary.md"
import datetime, json, re, sys
out, t0, model, size, steps = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dp = int(sys.argv[12])
off, on = [float(x) for x in sys.argv[6].split()], [float(x) for x in sys.argv[7].split()]
params = re.search(r"(\d+) parameters", open(f"{out}/off1.log", errors="replace").read()).group(1)
log = open(f"{out}/killed.log", errors="replace").read()
line = [l for l in log.splitlines() if "survive: step 3 (redone) completed" in l][0]
t = datetime.datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
m = {r["step"]: r for r in map(json.loads, open(f"{out}/killed/p/e/metrics.jsonl"))}
mean = lambda v: sum(v) / len(v)
print(f"{sys.argv[10]}, {model} ({params} parameters), {steps} steps, {size} a step")
print()
print("| key | timing_s/step, mean of steps 2.. per run | mean |")
print("|---|---|---|")
print(f"| off | {' '.join(f'{x:.3f}' for x in off)} | {mean(off):.3f} |")
print(f"| on | {' '.join(f'{x:.3f}' for x in on)} | {mean(on):.3f} |")
spare = [float(x) for x in sys.argv[8].split()]
if spare:
    print(f"| on, and a spare rank waiting (4 ranks) | {' '.join(f'{x:.3f}' for x in spare)} | {mean(spare):.3f} |")
print()
print(f"on / off: {mean(on) / mean(off):.3f}" + (f"; spare / on: {mean(spare) / mean(on):.3f}" if spare else ""))
kept = [l for l in open(f"{out}/on1.log", errors="replace") if "start kept" in l or "copies of the state" in l]
if kept:
    print()
    print("the copy the key adds to each step (rank 0, on1): " + "; ".join(k.split("survive: ")[1].strip() for k in kept))
print()
print(f"{sys.argv[11]} (GRPO_TEST_KILL_AT) killed: the kill to the redone step's end {t.timestamp() - t0:.2f} s; rank 0: "
      f"{line.split('survive: ')[1]}; step 2 took {m[2]['timing_s/step']:.2f} s ({dp} DP ranks), step 3 (redone, {dp - 1}) "
      f"{m[3]['timing_s/step']:.2f} s from its restart")
if sys.argv[9]:
    log = open(f"{out}/killed-spare.log", errors="replace").read()
    line = [l for l in log.splitlines() if "survive: step 3 (redone) completed" in l][0]
    t = datetime.datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
    joined = [l for l in log.splitlines() if "joined as DP rank" in l][0]
    m = {r["step"]: r for r in map(json.loads, open(f"{out}/killed-spare/p/e/metrics.jsonl"))}
    print()
    print(f"the same with a spare: the kill to the redone step's end {t.timestamp() - float(sys.argv[9]):.2f} s; "
          f"rank 0: {line.split('survive: ')[1]}; the spare: {joined.split('survive: ')[1]}; step 2 took "
          f"{m[2]['timing_s/step']:.2f} s (3 ranks), step 3 (redone, 3 ranks) {m[3]['timing_s/step']:.2f} s")
PY
echo "[bench] $OUT/summary.md" >&2
