#!/usr/bin/env bash
# A lease has a deadline (issue 27): a rollout process that stays alive (its ping thread goes on) but holds its
# first unit without delivering it (GRPO_TEST_HOLD_UNIT, a test-only hold in rollout_role.c) loses the unit to the
# other rollout rank once the lease is past (its floor lowered to 2 s with GRPO_TEST_LEASE_FLOOR_S, a test-only
# setting in dispatcher.c). The split run of a tiny model (1 trainer + 2 rollout ranks) finishes with weights
# bit-identical to the undisturbed run's, every group exactly rollout.n times a step in the audit, and the late
# copy, when it comes, dropped (dataplane/duplicates). Without the lease the held unit waits for its holder, and
# no check of the dispatcher's regrant passes. Then a stale grant: rollout rank 0 frozen (SIGSTOP) before it fetches
# its first grant's policy version, taken for lost, woken two versions later: the dispatcher no longer holds the
# version, and rank 0 asks for new work instead of failing the job (it failed a CI run so, after a silent weight
# relay's timeout); 200 steps, every group exactly rollout.n times a step.
# usage: test_lease.sh (the build's programs by name, tests/lib.sh)
. "$(dirname "$0")/../lib.sh" grpo-lease
test_env
. "$(dirname "$0")/tiny_split.sh"
tiny_split "$TMP"
expect "tiny model and split run configuration" $?
MPIRUN=(mpirun --oversubscribe --bind-to none -np 3)
STEPS=8
# heartbeats every 2 s: the holding process is lost only after 4 s of silence, and it is never silent (its pings
# go on while it holds the unit), so only the lease can take the unit from it
KEYS=(rollout.n_gpus_per_node=2 trainer.total_training_steps=$STEPS grpod.heartbeat_interval_s=2
    trainer.log_level=info)
run() { # NAME ENV...: a split run writing $TMP/NAME and $TMP/NAME.log
    local name="$1"
    shift
    timeout "$(scaled 240)" "${MPIRUN[@]}" "$@" "$WORKER" --config "$TMP/split.yaml" "${KEYS[@]}" \
        trainer.default_local_dir="$TMP/$name" trainer.rollout_data_dir="$TMP/$name/audit" >"$TMP/$name.log" 2>&1
}
run plain
expect "the undisturbed split run finishes" $?
# rollout rank 0 holds its first unit 12 s: past the 2 s lease, and (on a loaded machine) still within the run
run held -x GRPO_TEST_LEASE_FLOOR_S=2 -x GRPO_TEST_HOLD_UNIT=0:12
expect "the split run with a unit held past its lease finishes" $?
says "$TMP/held.log" "GRPO_TEST_HOLD_UNIT: holding step"; expect "rollout rank 0 held its first unit" $?
says "$TMP/held.log" "past its lease of 2 s; "; expect "the dispatcher saw the lease pass" $?
says "$TMP/held.log" "granted again to the process serving rank 1"; expect "the unit went to rollout rank 1" $?
! has "$TMP/held.log" " lost: silent"; expect "the holding process was never taken for lost (it pinged)" $?
# the holder's late copy comes before it asks for its next unit, which the next step waits for: always in the run
says "$TMP/held.log" "0 duplicate(s), 1 stale;"; expect "the late copy was dropped (its step was trained)" $?
python3 - "$TMP/held/p/e/metrics.jsonl" <<'PY'
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
sys.exit(0 if last.get("dataplane/duplicates") == 1 else f"dataplane/duplicates {last.get('dataplane/duplicates')}")
PY
expect "the metrics count one copy dropped (dataplane/duplicates)" $?
ckpt() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor/model.safetensors"; }
cmp -s "$(ckpt plain)" "$(ckpt held)"; expect "final weights bit-identical to the undisturbed run's" $?
python3 "$(dirname "$0")/../mpi/check_audit.py" "$TMP/held/audit" 2 2 "$STEPS"
expect "audit files: every group exactly rollout.n times per step" $?
# rollout rank 0 holds its first grant that needs a policy version fetched, and the test freezes it there (SIGSTOP)
# until the trainers have logged step 3 (two versions later): the dispatcher takes it for lost and grants its units
# to rank 1; woken (SIGCONT, its hold file removed), it fetches a version gone by (as after a silent weight relay's
# timeout on a loaded machine; CI 2026-12-06 ended the job there): it asks for new work and the run finishes as the
# undisturbed one (200 steps of the tiny model: the run is still on when rank 0 wakes, at step 3)
touch "$TMP/fetch.hold"
KEYS=("${KEYS[@]/#trainer.total_training_steps=*/trainer.total_training_steps=200}")
run gone -x GRPO_TEST_HOLD_FETCH="0:$TMP/fetch.hold" &
job=$!
track "$job"
held_pid() { sed -n 's/.*GRPO_TEST_HOLD_FETCH: holding .*(pid \([0-9]*\)).*/\1/p' "$TMP/gone.log"; }
held() { [ -n "$(held_pid)" ] || ! kill -0 "$job" 2>/dev/null; }
wait_for 120 held
pid="$(held_pid)"
[ -n "$pid" ] && kill -STOP "$pid"
expect "rank 0 holds its first fetch (pid ${pid:-none}), frozen" $?
step3() { [ "$(grep -c . "$TMP/gone/p/e/metrics.jsonl" 2>/dev/null)" -ge 3 ] || ! kill -0 "$job" 2>/dev/null; }
wait_for 120 step3
rm -f "$TMP/fetch.hold"
[ -n "$pid" ] && kill -CONT "$pid"
wait "$job"
expect "the split run whose rank 0 fetches a version gone by finishes" $?
says "$TMP/gone.log" "the run is past this unit (granted again elsewhere); asking for new work"
expect "rank 0 found its grant's version gone and asked for new work" $?
python3 "$(dirname "$0")/../mpi/check_audit.py" "$TMP/gone/audit" 2 2 200
expect "audit files: every group exactly rollout.n times per step" $?
finish "$TMP/held.log"
