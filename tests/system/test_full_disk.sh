#!/usr/bin/env bash
# A full disk is found at the first failed write, not at the next checkpoint: a run whose records cannot be
# written (metrics.jsonl, the rollout dumps of trainer.rollout_data_dir; /dev/full stands in for a full disk)
# reports the file and the error once, checkpoints (there is room for that here) and stops at step 1 with a
# non-zero exit, in one process and split over 2 trainer + 1 rollout ranks (the dumps of trainer DP rank 1 fail:
# DP rank 0 stops the run for every rank). A run that writes to /dev/null instead is not stopped.
# usage: test_full_disk.sh (from the source root; the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-full
WORKER="$(prog grpo-worker)" MODEL_TOOL="$(prog grpo-model)"
test_env
[ -w /dev/full ] || { echo "skip: no writable /dev/full"; exit 77; }

tiny_model "$TMP/tiny"
expect "tiny model initialised" $?
tiny_run COMMON "$TMP" 200 # (each run names its own trainer.default_local_dir)
COMMON+=(data.max_response_length=6)
# lines of LOG in which SUBSYS reports a failed write of FILE: reports LOG SUBSYS FILE
reports() { grep -c "error \[rank [0-9]*\] $2: writing .*$3: No space left on device" "$1"; }

# ---- metrics.jsonl on a full disk, one process
mkdir -p "$TMP/m/p/e"
ln -s /dev/full "$TMP/m/p/e/metrics.jsonl"
timeout "$(scaled 120)" "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/m" >"$TMP/m.log" 2>&1
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]; expect "the run ends with an error (exit $rc)" $?
grep -q "writing $TMP/m/p/e/metrics.jsonl: No space left on device" "$TMP/m.log"
expect "the error names the file and the reason" $?
[ "$(reports "$TMP/m.log" metrics metrics.jsonl)" -eq 1 ]; expect "reported once as an error" $?
grep -q "stopped at step 1: writing $TMP/m/p/e/metrics.jsonl: No space left on device" "$TMP/m.log"
expect "the run stops at step 1 with the reason" $?
[ "$(cat "$TMP/m/p/e/checkpoints/latest_checkpointed_iteration.txt" 2>/dev/null)" = 1 ]
expect "a checkpoint of step 1 is written first" $?
! grep -q "step *2/200" "$TMP/m.log"; expect "no second step is trained" $?

# ---- the rollout dump of step 1 on a full disk, one process
mkdir -p "$TMP/a/dumps"
ln -s /dev/full "$TMP/a/dumps/1.jsonl"
timeout "$(scaled 120)" "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/a" trainer.rollout_data_dir="$TMP/a/dumps" \
    >"$TMP/a.log" 2>&1
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]; expect "a failed rollout dump ends the run with an error (exit $rc)" $?
grep -q "stopped at step 1: writing $TMP/a/dumps/1.jsonl: No space left on device" "$TMP/a.log"
expect "the run stops at step 1 naming the dump file" $?
[ "$(reports "$TMP/a.log" audit 1.jsonl)" -eq 1 ]; expect "the dump's failure is reported once" $?
[ ! -e "$TMP/a/dumps/2.jsonl" ]; expect "no step 2 is dumped" $?

# ---- split run with two trainers: the step's one dump (DP rank 0 writes every rank's lines) fails; DP rank 0
# stops every rank
mkdir -p "$TMP/s/dumps"
ln -s /dev/full "$TMP/s/dumps/1.jsonl"
timeout "$(scaled 180)" mpirun --oversubscribe --bind-to none -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/s" \
    trainer.rollout_data_dir="$TMP/s/dumps" placement.trainer_ranks=2 placement.rollout_ranks=1 \
    >"$TMP/s.log" 2>&1
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]; expect "split run ends with an error (exit $rc)" $?
grep -q "\[rank 0\] audit: writing $TMP/s/dumps/1.jsonl: No space left on device" "$TMP/s.log"
expect "trainer DP rank 0 names the step's dump file" $?
grep -q "\[rank 0\] trainer: stopped at step 1: writing $TMP/s/dumps/1.jsonl" "$TMP/s.log"
expect "DP rank 0 stops the run at step 1 for it" $?
[ "$(cat "$TMP/s/p/e/checkpoints/latest_checkpointed_iteration.txt" 2>/dev/null)" = 1 ]
expect "the split run checkpoints step 1 first" $?

# ---- /dev/null takes everything: not a failure
mkdir -p "$TMP/n/p/e"
ln -s /dev/null "$TMP/n/p/e/metrics.jsonl"
timeout "$(scaled 120)" "$WORKER" "${COMMON[@]}" trainer.total_training_steps=2 trainer.default_local_dir="$TMP/n" \
    >"$TMP/n.log" 2>&1
expect "metrics.jsonl pointed at /dev/null: the run finishes (exit $?)" $?

finish
