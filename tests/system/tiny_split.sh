# shellcheck shell=bash
# Sourced by the launcher tests: tiny_split MODEL_TOOL SRC DIR writes a tiny random model to DIR/tiny and
# DIR/split.yaml, a 3-step run of it split into 1 trainer + 1 rollout rank (verl's keys) writing to DIR/runs.
# Returns the model tool's status.
tiny_split() {
    local tool="$1" src="$2" dir="$3"
    "$tool" init "$src/tests/fixtures/tokenizers/bytes-chatml/config.json" "$dir/tiny" \
        --tokenizer-from "$src/tests/fixtures/tokenizers/bytes-chatml" --seed 11 --std 0.1 >"$dir/init.log" 2>&1 ||
        return 1
    cat >"$dir/split.yaml" <<YAML
data: {train_batch_size: 2, max_response_length: 8, synthetic: {num_train: 16, num_val: 2}}
actor_rollout_ref:
  model: {path: $dir/tiny}
  rollout: {n: 2}
  actor: {ppo_mini_batch_size: 2}
trainer: {nnodes: 1, n_gpus_per_node: 1, total_training_steps: 3, val_before_train: false,
          default_local_dir: $dir/runs, project_name: p, experiment_name: e}
rollout: {nnodes: 1, n_gpus_per_node: 1}
grpod: {connect_timeout_s: 30}
YAML
}
