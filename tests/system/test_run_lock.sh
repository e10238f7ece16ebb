#!/usr/bin/env bash
# One job at a time in a run directory (issue 40 item 8: the same run.yaml submitted twice checkpointed into one
# place and one job failed on metrics.svg). While a job runs, a second one on the same run directory stops at
# start, exit status non-zero, naming the first job's pid and host; once the first is killed (SIGKILL: no clean
# exit) the kernel has dropped its lock and the next job runs to its end.
# usage: test_run_lock.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" run-lock
test_env
tiny_model "$TMP/tiny"; expect "tiny model" $?
cat >"$TMP/run.yaml" <<YAML
data: {train_batch_size: 2, max_response_length: 8, synthetic: {num_train: 16, num_val: 2}}
actor_rollout_ref:
  model: {path: $TMP/tiny}
  rollout: {n: 2}
  actor: {ppo_mini_batch_size: 2}
trainer: {val_before_train: false, save_freq: -1, resume_mode: disable,
          default_local_dir: $TMP/runs, project_name: p, experiment_name: e}
YAML
"$WORKER" --config "$TMP/run.yaml" trainer.total_training_steps=100000 >"$TMP/first.log" 2>&1 &
FIRST=$!
track "$FIRST"
wait_for 120 grep -q "^pid $FIRST on host" "$TMP/runs/p/e/run.lock"; expect "the first job holds run.lock" $?
timeout -k 5 "$(scaled 120)" "$WORKER" --config "$TMP/run.yaml" trainer.total_training_steps=2 >"$TMP/second.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ]; expect "a second job on the same run directory stops at start (rc $rc)" $?
says "$TMP/second.log" "is in use by another job (pid $FIRST on host $(hostname)"
expect "... naming the first job's pid and host" $?
kill -0 "$FIRST" 2>/dev/null; expect "the first job runs on, untouched" $?
kill -KILL "$FIRST"; wait "$FIRST" 2>/dev/null
timeout -k 5 "$(scaled 300)" "$WORKER" --config "$TMP/run.yaml" trainer.total_training_steps=2 >"$TMP/third.log" 2>&1
expect "after the first job is killed, a job on the same directory runs to its end" $?
steps_logged "$TMP/runs/p/e/metrics.jsonl" 2; expect "... and logs its steps" $?
finish
