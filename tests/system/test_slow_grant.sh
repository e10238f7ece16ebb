#!/usr/bin/env bash
# Work is never lost between two processes (issue 26): the dispatcher answers the rollout rank's first grant
# later than the rollout process waits for it (GRPO_TEST_SLOW_GRANT_S, a test-only delay in dispatcher.c), so
# the process never hears it and asks again. It is granted the same unit again, and the split run of a tiny model
# (1 trainer + 1 rollout rank) ends with weights bit-identical to the undisturbed run's.
# usage: test_slow_grant.sh (the build's programs by name, tests/lib.sh)
. "$(dirname "$0")/../lib.sh" grpo-slow-grant
test_env
. "$(dirname "$0")/tiny_split.sh"
tiny_split "$TMP"
expect "tiny model and split run configuration" $?
MPIRUN=(mpirun --oversubscribe --bind-to none -np 2)
# heartbeats every 4 s: the process is lost after 8 s of silence, later than the 6 s answer (a lost process's
# units go back anyway, which would hide a unit lost by its answer)
KEYS=(grpod.heartbeat_interval_s=4 trainer.log_level=info)
timeout "$(scaled 120)" "${MPIRUN[@]}" "$WORKER" --config "$TMP/split.yaml" trainer.default_local_dir="$TMP/plain" "${KEYS[@]}" \
    >"$TMP/plain.log" 2>&1
expect "the undisturbed split run finishes" $?
timeout "$(scaled 120)" "${MPIRUN[@]}" -x GRPO_TEST_SLOW_GRANT_S=6 "$WORKER" --config "$TMP/split.yaml" \
    trainer.default_local_dir="$TMP/slow" "${KEYS[@]}" >"$TMP/slow.log" 2>&1
expect "the split run with a grant answered after the rollout process gave up finishes" $?
says "$TMP/slow.log" "this grant's answer goes 6.0 s late"; expect "the first grant was answered late" $?
says "$TMP/slow.log" "asking again"; expect "the rollout process gave up on it and asked again" $?
says "$TMP/slow.log" "step 1 unit 0 granted again to the process serving rank 0, which holds it"
expect "the dispatcher granted the same unit again" $?
! has "$TMP/slow.log" " lost: silent"; expect "the rollout process was never taken for lost" $?
ckpt() { echo "$TMP/$1/p/e/checkpoints/global_step_3/actor/model.safetensors"; }
cmp -s "$(ckpt plain)" "$(ckpt slow)"; expect "final weights bit-identical to the undisturbed run's" $?
finish "$TMP/slow.log"
