#!/usr/bin/env bash
# Multi-turn rollouts that call a real tool reproduce the single-process run (mpirun --oversubscribe on 2 cores):
# the bundled SmolLM2-135M-Instruct on the agent demo's task (data.synthetic.task=tool_arithmetic: two worked
# examples, then a multiplication the model answers with the calculator, a deterministic tool), one GRPO step of
# 2 prompts x 2 trajectories:
#  - the run calls the tool (multi_turn/tool_call_rate above 0, tool tokens in the responses);
#  - colocated DP2 and split 2 trainers + 1 rollout rank give the single-process losses, grad norm, entropy and
#    scores within 1e-5 relative, and its weights within 1e-5.
# In the suites mpi and long (the plain build only: the 135M model under the sanitizers would take most of an hour).
# Skipped (77) when the bundled model is not there (scripts/fetch_model.sh; GRPO_MODEL_GGUF names it).
# usage: test_multi_turn_tools.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-mtt
test_env
MPIRUN=(timeout "$(scaled 400)" mpirun --oversubscribe --bind-to none)
gguf="${GRPO_MODEL_GGUF:-$HOME/.cache/grpo/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ ! -r "$gguf" ]; then
    echo "SKIP: the bundled model is not there ($gguf; scripts/fetch_model.sh fetches it)"
    exit 77
fi
"$MODEL_TOOL" convert "$gguf" "$TMP/model" >"$TMP/convert.log" 2>&1
expect "the bundled model converted" $?

KEYS=(actor_rollout_ref.model.path="$TMP/model" trainer.project_name=p trainer.experiment_name=e
    data.synthetic.task=tool_arithmetic data.synthetic.min_digits=4 data.synthetic.max_digits=5 'data.synthetic.ops=*'
    data.synthetic.num_train=16 data.synthetic.num_val=1 actor_rollout_ref.rollout.multi_turn.enable=true
    data.max_response_length=64 data.max_prompt_length=384 trainer.total_training_steps=1
    trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=1 data.train_batch_size=2
    actor_rollout_ref.rollout.n=2 actor_rollout_ref.actor.ppo_mini_batch_size=2
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1
    actor_rollout_ref.actor.optim.lr=1e-5 actor_rollout_ref.actor.optim.eps=1e-6)
"$WORKER" "${KEYS[@]}" trainer.default_local_dir="$TMP/one" >"$TMP/one.log" 2>&1
expect "single-process run finishes" $?
out=$(python3 - "$TMP/one/p/e/metrics.jsonl" <<'PY'
import json, sys
r = [r for r in map(json.loads, open(sys.argv[1])) if "multi_turn/tool_call_rate" in r][-1]
print(f"tool-call rate {r['multi_turn/tool_call_rate']}, tool tokens {r['response_length/tool_tokens/mean']}")
sys.exit(0 if r["multi_turn/tool_call_rate"] > 0 and r["response_length/tool_tokens/mean"] > 0 else 1)
PY
)
expect "the run calls the calculator ($out)" $?

"${MPIRUN[@]}" -np 2 "$WORKER" "${KEYS[@]}" trainer.default_local_dir="$TMP/colo" trainer.nnodes=1 \
    trainer.n_gpus_per_node=2 >"$TMP/colo.log" 2>&1
expect "colocated DP2 run finishes" $?
"${MPIRUN[@]}" -np 3 "$WORKER" "${KEYS[@]}" trainer.default_local_dir="$TMP/split" placement.trainer_ranks=2 \
    placement.rollout_ranks=1 >"$TMP/split.log" 2>&1
expect "split 2+1 run finishes" $?
for run in colo split; do
    out=$(python3 - "$TMP/one/p/e/metrics.jsonl" "$TMP/$run/p/e/metrics.jsonl" <<'PY'
import json, sys
a = [r for r in map(json.loads, open(sys.argv[1])) if "actor/pg_loss" in r][-1]
b = [r for r in map(json.loads, open(sys.argv[2])) if "actor/pg_loss" in r][-1]
worst = 0
for k in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean", "response_length/mean",
          "multi_turn/tool_calls/mean", "num_turns/mean"):
    rel = abs(a[k] - b[k]) / max(abs(a[k]), 1e-2 if k == "actor/pg_loss" else 1e-3)
    worst = max(worst, rel)
    if rel > 1e-5:
        sys.exit(f"{k}: {a[k]} against {b[k]}")
print(f"worst relative difference {worst:.1e}")
PY
)
    expect "$run: losses, grad norm, entropy, scores and tool calls match one process ($out)" $?
    out=$("$COMPARE" "$TMP/one/p/e/checkpoints/global_step_1/actor" "$TMP/$run/p/e/checkpoints/global_step_1/actor" \
        1e-5 2>&1)
    expect "$run: weights after the step match one process within 1e-5 ($out)" $?
done
finish
