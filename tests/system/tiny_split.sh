# shellcheck shell=bash
# Sourced by the launcher tests after tests/lib.sh: tiny_split DIR writes a tiny random model to DIR/tiny
# (tiny_model, with $MODEL_TOOL) and DIR/split.yaml, a 3-step run of it split into 1 trainer + 1 rollout rank
# (verl's keys) writing to DIR/runs. Returns the model tool's status.
tiny_split() {
    local dir="$1"
    tiny_model "$dir/tiny" || return 1
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
