#!/usr/bin/env bash
# Model-parallel layouts of the trainers against one trainer rank, in one run, on this machine: the update's
# time under DP2, TP2 and PP2 (two trainer ranks, one thread each) against one trainer rank (one thread), and
# each layout's measured peak memory per trainer rank against grpo-model plan's prediction. Trainer rank 0 also
# runs the dispatcher, which keeps a copy of the whole FP32 weights to serve (on-policy: one), so its peak is
# compared with the prediction plus that copy; the other trainer ranks' peak with the prediction alone.
#
# The model is a synthetic Llama (hidden 512, 8 layers, 8 query / 4 KV heads, intermediate 1536, the test
# fixtures' 259-token byte vocabulary: 25 M parameters) with random weights; the task is the built-in
# arithmetic one. One rollout rank generates on-policy (actor_rollout_ref.rollout.mode=sync), so it is idle
# while the trainers update and the update's time (timing_s/update_actor) is the trainers' alone.
#
#   bench/run_parallel_bench.sh            # STEPS=4 steps per layout (the first is a warm-up)
#   STEPS=6 bench/run_parallel_bench.sh
#
# Results: $OUT (default build/bench-results/parallel-<time>/): one run directory and log per layout, the
# planner's output, and summary.md, the table docs/results/performance.md quotes.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-4}"
OUT="${OUT:-build/bench-results/parallel-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
. scripts/blas_env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TOK=tests/fixtures/tokenizers/bytes-chatml
python3 - "$TOK/config.json" "$OUT/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4)
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
build/worker/grpo-model init "$OUT/config.json" "$OUT/model" --tokenizer-from "$TOK" --seed 5 --std 0.05 \
    >"$OUT/init.log" 2>&1
PROMPTS=8 N=4 RESP=48
COMMON=(actor_rollout_ref.model.path="$OUT/model" trainer.total_training_steps="$STEPS" trainer.val_before_train=false
    trainer.test_freq=-1 trainer.save_freq=-1 trainer.project_name=bench trainer.experiment_name=run
    data.train_batch_size=$PROMPTS actor_rollout_ref.rollout.n=$N data.max_response_length=$RESP
    actor_rollout_ref.actor.ppo_mini_batch_size=$PROMPTS actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
    actor_rollout_ref.rollout.mode=sync data.synthetic.num_train=256)

# name trainers tp pp
for layout in "one 1 1 1" "dp2 2 1 1" "tp2 2 2 1" "pp2 2 1 2"; do
    set -- $layout
    echo "[bench] $1: $2 trainer rank(s), TP $3, PP $4, + 1 rollout rank" >&2
    mpirun --oversubscribe --bind-to none -np $(($2 + 1)) build/worker/grpo-worker "${COMMON[@]}" \
        trainer.default_local_dir="$OUT/$1" placement.trainer_ranks="$2" placement.rollout_ranks=1 \
        actor_rollout_ref.actor.megatron.tensor_model_parallel_size="$3" \
        actor_rollout_ref.actor.megatron.pipeline_model_parallel_size="$4" >"$OUT/$1.log" 2>&1
done
# the planner's memory per trainer rank for the same batch (prompt length: the task's mean, measured)
plen=$(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][-1]; \
print(max(1, round(r['perf/total_num_tokens'] / ($PROMPTS * $N) - r['response_length/mean'])))" \
    "$OUT/one/bench/run/metrics.jsonl")
for dev in 1 2; do
    build/worker/grpo-model plan "$OUT/config.json" --cpu --nodes 1 --gpus-per-node $dev --gpu-mem 24 \
        --prompts $PROMPTS --n $N --prompt-len "$plen" --response-len $RESP --micro-batch 4 --mini-batches 1 \
        --no-recompute --all --bytes >"$OUT/plan-$dev.txt" 2>&1
done

python3 - "$OUT" "$STEPS" "$(git rev-parse --short HEAD)" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY' | tee "$OUT/summary.md"
import json, re, sys
out, steps, rev, load = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
plans = open(f"{out}/plan-1.txt").read() + open(f"{out}/plan-2.txt").read()
def planned(tp, pp, dp):
    m = re.search(rf"bytes tp={tp} pp={pp} dp={dp} zero1=0: .* sync (\d+) memory (\d+)", plans)
    return (float(m.group(2)) / 1e9, float(m.group(1)) / 1e9) if m else (float("nan"), 0.0)
def peaks(name):  # each trainer rank's "peak resident memory of this rank" line, by rank
    got = {}
    for line in open(f"{out}/{name}.log"):
        m = re.search(r"\[rank (\d+)\] worker: peak resident memory of this rank: ([0-9.]+) GB", line)
        if m:
            got[int(m.group(1))] = float(m.group(2))
    return got
print(f"Trainer layouts of a 25 M-parameter Llama, steps 2..{steps} (commit {rev}, load {load})\n")
print("| layout | trainer ranks | update (s) | speed-up vs one | TP MB/step | PP MB/step | PP bubble | planned GB/rank | "
      "rank 0 peak GB (planned + copy) | other ranks' peak GB |")
print("|---|---|---|---|---|---|---|---|---|---|")
base = None
for name, ranks, tp, pp, dp in (("one", 1, 1, 1, 1), ("dp2", 2, 1, 1, 2), ("tp2", 2, 2, 1, 1), ("pp2", 2, 1, 2, 1)):
    rows = [json.loads(l) for l in open(f"{out}/{name}/bench/run/metrics.jsonl") if l.strip()]
    rows = [r for r in rows if r["step"] >= 2]
    mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
    upd = mean("timing_s/update_actor")
    base = base or upd
    plan, copy = planned(tp, pp, dp)
    pk = peaks(name)
    others = [v for k, v in sorted(pk.items()) if 0 < k < ranks]
    bubble = f"{mean('perf/pp_bubble'):.0%}" if "perf/pp_bubble" in rows[0] else "-"
    print(f"| {name} | {ranks} | {upd:.2f} | {base / upd:.2f}x | {mean('perf/comm_bytes/tp') / 1e6:.0f} | "
          f"{mean('perf/comm_bytes/pp') / 1e6:.1f} | {bubble} | {plan:.3f} | "
          f"{pk.get(0, float('nan')):.3f} ({plan + copy:.3f}) | "
          f"{', '.join(f'{v:.3f}' for v in others) or '-'} |")
PY
