#!/usr/bin/env bash
# verl's own GRPO launch scripts, unchanged: the argument vector of every script in verl v0.7.0's
# examples/grpo_trainer and recipe/dapo, and in verl v0.9.0's examples/grpo_trainer, recipe/dapo and
# verl/experimental/fully_async_policy/shell, recorded as bash delivers it (tests/fixtures/verl/scripts/*.args and
# tests/fixtures/verl/scripts/v0.9.0/*.args, made by scripts/record_verl_scripts.sh), goes to grpo-worker
# --print-config: each is accepted, or refused naming a feature that is not available (never an unknown key, a
# wrong value or a crash). Then verl's GSM8K + MATH example (v0.7.0's run_qwen2-7b_math.sh) runs on a tiny model
# with its own arguments, only the model, the data (two parquet files in verl's layout given in verl's list form),
# the sizes and the placement overridden, and a Python reward function:
# trainer.total_epochs decides the steps, trainer.logger's console-only sinks mean no TensorBoard files and a
# notice for wandb, trainer.device (not in the script) is auto and said, and the Python scorer scores.
# Usage: test_verl_scripts.sh   (from the source root; the build's programs by name, tests/lib.sh). The run part is
# skipped (the --print-config part still runs) when the pyarrow venv of scripts/parquet_env.sh cannot be made.
set -u
. "$(dirname "$0")/../lib.sh" grpo-verl-scripts
test_env
export GRPO_CACHE="$TMP/cache"
crashed() { grep -qE "Segmentation|Aborted|core dumped|AddressSanitizer" "$1"; }

# overrides FILE: the recorded arguments that are Hydra overrides, and Hydra's --config-name / --config-path (the
# module left out)
overrides() {
    grep -v '^#' "$1" | grep -E '^[^-].*=|^--config-(name|path)='
}

# replay VERSION DIR MIN: every recorded script of DIR through --print-config; MIN: at least this many recorded
replay() {
    local version="$1" dir="$2" min="$3" accepted=0 refused=0 total=0 f name rc
    : >"$TMP/summary-$version"
    for f in "$dir"/*.args; do
        name="$(basename "$f" .args)"
        mapfile -t args < <(overrides "$f")
        "$WORKER" --print-config "${args[@]}" >"$TMP/$version-$name.out" 2>&1
        rc=$?
        total=$((total + 1))
        if [ $rc -eq 0 ]; then
            accepted=$((accepted + 1))
            echo "accepted $name" >>"$TMP/summary-$version"
        elif [ $rc -eq 2 ] && grep -qE "error config: .*not available" "$TMP/$version-$name.out" &&
            ! grep -q "unknown key" "$TMP/$version-$name.out"; then
            refused=$((refused + 1))
            echo "refused  $name: $(grep -o 'error config: .*' "$TMP/$version-$name.out" | cut -c15-)" \
                >>"$TMP/summary-$version"
        else
            fail "verl $version $name: rc $rc, not accepted nor refused by a named feature: $(tail -1 "$TMP/$version-$name.out")"
        fi
        ! crashed "$TMP/$version-$name.out" || fail "verl $version $name: crashed"
    done
    cat "$TMP/summary-$version"
    echo "verl $version scripts: $total, accepted $accepted, refused for a named feature $refused"
    [ "$total" -ge "$min" ]; expect "every recorded verl $version script was tried ($total)" $?
    [ $((accepted + refused)) -eq "$total" ]; expect "each verl $version script accepted or refused for a named feature" $?
}
# verl v0.7.0's examples/grpo_trainer and recipe/dapo; v0.9.0's, with the fully-async trainer's scripts
# (verl/experimental/fully_async_policy/shell) and recipe/dapo from the verl-recipe submodule
replay v0.7.0 tests/fixtures/verl/scripts 70
replay v0.9.0 tests/fixtures/verl/scripts/v0.9.0 85

# --- Megatron's learning-rate schedule under its keys (verl's megatron optim block, as the fully-async Megatron scripts
# give lr_decay_steps): 6 steps, warm-up from 1e-4 to 1e-3 over 2, linear down to min_lr 2e-4 at step 4, then flat.
# Each step's actor/lr against Megatron's formula worked by hand (the first update is scheduler step 0)
tiny_model "$TMP/tiny"; expect "tiny model written" $?
(cd "$TMP" && timeout "$(scaled 120)" "$WORKER" actor_rollout_ref.model.path="$TMP/tiny" \
    trainer.default_local_dir="$TMP/sched" trainer.total_training_steps=6 trainer.test_freq=-1 \
    trainer.val_before_train=false data.synthetic.shots=0 data.synthetic.num_val=4 data.train_batch_size=2 \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.rollout.n=2 data.max_response_length=4 \
    actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.optim.lr_warmup_steps=2 \
    actor_rollout_ref.actor.optim.lr_warmup_init=1e-4 actor_rollout_ref.actor.optim.lr_decay_style=linear \
    actor_rollout_ref.actor.optim.lr_decay_steps=4 actor_rollout_ref.actor.optim.min_lr=2e-4 \
    actor_rollout_ref.actor.optim.weight_decay_incr_style=linear) >"$TMP/sched.out" 2>&1
expect "a run with Megatron's schedule keys finishes (rc $?)" $?
python3 - "$(ls "$TMP"/sched/*/*/metrics.jsonl | head -1)" <<'PY'
import json, sys
lr = [json.loads(l)["actor/lr"] for l in open(sys.argv[1]) if l.strip()]
# warm-up: 1e-4 + 9e-4 * n / 2 for n = 0, 1, 2; linear: 2e-4 + 8e-4 * (1 - (n - 2) / 2) for n = 3, 4; past 4: 2e-4
want = [1e-4, 5.5e-4, 1e-3, 6e-4, 2e-4, 2e-4]
assert len(lr) == 6 and all(abs(a - b) < 1e-12 for a, b in zip(lr, want)), (lr, want)
print("actor/lr:", lr)
PY
expect "actor/lr follows Megatron's warm-up, linear decay and floor step by step" $?

# --- the GSM8K + MATH example runs
if ! py="$(./scripts/parquet_env.sh 2>"$TMP/env.log")"; then
    tail -3 "$TMP/env.log"
    echo "SKIP the run: scripts/parquet_env.sh could not make the pyarrow venv (no network?)"
    finish
fi
"$py" - "$TMP" <<'PY'
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
d = sys.argv[1]
def rows(source, start):
    out = []
    for i in range(2):
        a, b = start + i, 4 + 2 * i
        q = f"Tom has {a} apples and buys {b} more. How many apples?"
        out.append({"data_source": source,
                    "prompt": [{"role": "user", "content": q + ' Output the final answer after "####".'}],
                    "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                    "extra_info": {"split": "train", "index": i}})
    return out
pq.write_table(pa.Table.from_pylist(rows("openai/gsm8k", 3)), os.path.join(d, "gsm8k.parquet"))
pq.write_table(pa.Table.from_pylist(rows("lighteval/MATH", 10)), os.path.join(d, "math.parquet"))
pq.write_table(pa.Table.from_pylist(rows("parity", 20) + rows("parity", 30) + rows("parity", 40) + rows("parity", 50)),
               os.path.join(d, "parity.parquet"))
PY
expect "pyarrow wrote two parquet files in verl's layout" $?
mapfile -t args < <(overrides tests/fixtures/verl/scripts/grpo_trainer__run_qwen2-7b_math.args)
timeout "$(scaled 300)" "$WORKER" "${args[@]}" \
    actor_rollout_ref.model.path="$TMP/tiny" \
    "data.train_files=['$TMP/gsm8k.parquet', '$TMP/math.parquet']" \
    "data.val_files=['$TMP/gsm8k.parquet']" \
    data.train_batch_size=2 actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.rollout.n=2 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 data.max_prompt_length=320 data.max_response_length=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 trainer.n_gpus_per_node=1 trainer.total_epochs=1 \
    trainer.test_freq=-1 trainer.val_before_train=false \
    custom_reward_function.path=tests/fixtures/rewards/verl_reward.py \
    trainer.default_local_dir="$TMP/runs" >"$TMP/run.out" 2>&1
rc=$?
expect "verl's GSM8K + MATH example runs on a tiny model (rc $rc)" $rc
says "$TMP/run.out" "4 train / 2 val prompts, 2 steps"
expect "both train files are read (4 prompts); total_epochs=1 x 4 prompts / batch 2 = 2 steps" $?
says "$TMP/run.out" "run finished at step 2"; expect "it trains 2 steps" $?
says "$TMP/run.out" "custom scorer compute_score from tests/fixtures/rewards/verl_reward.py (Python"
expect "the Python reward function scores the responses" $?
says "$TMP/run.out" "(Python, python3; 8 processes;"
expect "a pool of verl's default reward_model.num_workers=8 processes per scoring rank" $?
! grep -q "warn .*reward: sample" "$TMP/run.out"; expect "every response scored (no sample failed)" $?
says "$TMP/run.out" "trainer.device=auto: "; expect "the device verl's script did not name is said (auto)" $?
if grep -q "trainer.device=auto: cpu" "$TMP/run.out"; then
    ! grep -q "cuda:0" "$TMP/run.out"; expect "on the CPU (no usable GPU here)" $?
fi
says "$TMP/run.out" "trainer.logger: wandb skipped"; expect "wandb gets a notice" $?
run_dir="$(dirname "$(ls "$TMP"/runs/*/*/metrics.jsonl | head -1)")"
[ -s "$run_dir/metrics.jsonl" ]; expect "metrics.jsonl is written" $?
[ ! -e "$run_dir/tensorboard" ]; expect "no TensorBoard files: trainer.logger has no tensorboard" $?
! crashed "$TMP/run.out"; expect "no crash" $?

# --- verl's DAPO recipe (recipe/dapo/test_dapo_7b.sh) runs in one process: rounds of data.gen_batch_size=4 prompts,
# groups without reward variance dropped (filter_groups.metric=acc: the score, for a Python scorer), rounds repeated
# until data.train_batch_size=2 groups are kept, at most max_num_gen_batches=3; the overlong buffer under its
# current names. 8 prompts / 4 a round, total_epochs=1: 2 steps.
mapfile -t args < <(overrides tests/fixtures/verl/scripts/dapo__test_dapo_7b.args)
timeout "$(scaled 300)" "$WORKER" "${args[@]}" \
    actor_rollout_ref.model.path="$TMP/tiny" data.train_files="$TMP/parity.parquet" data.val_files="$TMP/parity.parquet" \
    data.gen_batch_size=4 data.train_batch_size=2 actor_rollout_ref.actor.ppo_mini_batch_size=2 \
    actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 data.max_prompt_length=320 \
    data.max_response_length=8 algorithm.filter_groups.max_num_gen_batches=3 trainer.nnodes=1 trainer.n_gpus_per_node=1 \
    +reward_model.reward_kwargs.overlong_buffer_cfg.len=4 reward_model.reward_kwargs.max_resp_len=8 \
    trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 \
    custom_reward_function.path=tests/fixtures/rewards/verl_reward.py \
    trainer.default_local_dir="$TMP/dapo" >"$TMP/dapo.out" 2>&1
rc=$?
expect "verl's DAPO recipe runs on a tiny model (rc $rc)" $rc
says "$TMP/dapo.out" "8 train / 8 val prompts, 2 steps"; expect "total_epochs counts rounds of gen_batch_size: 2 steps" $?
dapo_metrics="$(ls "$TMP"/dapo/*/*/metrics.jsonl | head -1)"
"$py" - "$dapo_metrics" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [s for s in steps if "train/num_gen_batches" in s]
assert len(steps) == 2, steps
for s in steps:
    rounds, kept = s["train/num_gen_batches"], s["train/num_kept_groups"]
    assert 1 <= rounds <= 3, rounds           # the bound is respected
    assert kept <= 2, kept                    # the step's batch is at most train_batch_size groups
    assert kept == 2 or rounds == 3, (kept, rounds)  # rounds go on until the batch is full, or the bound
print("dapo steps:", [(s["train/num_gen_batches"], s["train/num_kept_groups"]) for s in steps])
PY
expect "each step's rounds stop when 2 groups with reward variance are kept, at most 3 rounds" $?
! grep -q "warn .*reward: sample" "$TMP/dapo.out"; expect "every response scored (DAPO)" $?
! crashed "$TMP/dapo.out"; expect "no crash (DAPO)" $?
# --- verl's DAPO recipe with dynamic sampling off (recipe/dapo/run_dapo_qwen3_8b_base_npu.sh: data.gen_batch_size=48,
# data.train_batch_size=16, algorithm.filter_groups.enable=False): verl's DAPO trainer trains each round whole, so a
# step takes gen_batch_size prompts. Here gen_batch_size=4 and train_batch_size=2 on 8 prompts: 2 steps of 4 groups
mapfile -t args < <(overrides tests/fixtures/verl/scripts/v0.9.0/dapo__run_dapo_qwen3_8b_base_npu.args)
timeout "$(scaled 300)" "$WORKER" "${args[@]}" \
    actor_rollout_ref.model.path="$TMP/tiny" data.train_files="$TMP/parity.parquet" data.val_files="$TMP/parity.parquet" \
    data.gen_batch_size=4 data.train_batch_size=2 actor_rollout_ref.actor.ppo_mini_batch_size=2 \
    actor_rollout_ref.rollout.n=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 data.max_prompt_length=320 \
    data.max_response_length=8 actor_rollout_ref.actor.ulysses_sequence_parallel_size=1 \
    actor_rollout_ref.ref.ulysses_sequence_parallel_size=1 actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    trainer.n_gpus_per_node=1 trainer.total_training_steps=null trainer.val_before_train=false trainer.test_freq=-1 \
    trainer.save_freq=-1 custom_reward_function.path=tests/fixtures/rewards/verl_reward.py \
    trainer.rollout_data_dir="$TMP/rounds/audit" trainer.default_local_dir="$TMP/rounds" >"$TMP/rounds.out" 2>&1
rc=$?
expect "verl's DAPO recipe without dynamic sampling runs on a tiny model (rc $rc)" $rc
says "$TMP/rounds.out" "8 train / 8 val prompts, 2 steps"; expect "rounds of gen_batch_size=4 prompts: 2 steps" $?
[ "$(grep -c . "$TMP/rounds/audit/1.jsonl")" -eq 8 ] && [ "$(grep -c . "$TMP/rounds/audit/2.jsonl")" -eq 8 ]
expect "each step trains its whole round: 4 prompts x 2 responses (not train_batch_size=2's 4)" $?
! crashed "$TMP/rounds.out"; expect "no crash (DAPO without dynamic sampling)" $?
finish "$TMP/run.out" "$TMP/dapo.out" "$TMP/rounds.out"
