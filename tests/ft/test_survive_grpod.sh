#!/usr/bin/env bash
# Trainer-loss survival (trainer.survive_trainer_loss) under grpod: 3 colocated plain-DP ranks of this build (against
# Open MPI 5) under scripts/mpirun_ft, registered with grpod; rank 2 SIGKILLed at step 3 with its generation done
# (gen:3:2), and the lead then held at step 5's generation (gen:5:0, a second hold of GRPO_TEST_KILL_AT, not killed:
# the run is still under way while the test reads grpod's status). The survivors tell grpod (Heartbeat.survived):
#  - while the run goes on: rank 2 is "lost" with the reason "survived: DP 3 -> 2 at step 3", the run "running"
#    with a reason naming it, `grpoctl status` shows both, and grpod's events say so; the other ranks are not told
#    to end (grpod.heartbeat_timeout_s passes meanwhile without it);
#  - the hold released, the run finishes: grpod's run "finished" at step 5, mpirun exits 0, the weights equal one
#    process's within 1e-5 and the audit files hold every group of every step exactly rollout.n times.
# With a spare (trainer.survive_spare_ranks=1, 4 ranks): grpod shows launch rank 3 as a spare; rank 2 killed at step
# 3 (gen:3:2), the spare joins; grpod shows rank 2 lost ("survived: DP 3 -> 3 at step 3") and rank 3 a colocated
# rank at DP rank 2 with an event saying so; the run finishes, rank 3 finished, the weights one process's. A spare
# never needed is released at the end and shown finished.
# With TP model copies (DP 2 x TP 2, 4 ranks): rank 3 killed at step 3; grpod shows it lost ("survived: DP 2 -> 1 at
# step 3"), and rank 2, whose copy left, idle with an event saying why; the run finishes, rank 2 finished, the
# weights one process's.
# Work stealing with the key on (each host's lock-free ledger): rank 0 slowed at each generation's start, the others
# make its units, the weights one process's.
# Skipped (77) without Open MPI 5 (scripts/ompi5_env.sh --no-install).
set -u
. "$(dirname "$0")/../lib.sh" grpo-ft-grpod
# shellcheck source=tests/ft/survive_lib.sh
. "$(dirname "$0")/survive_lib.sh"
survive_start
# shellcheck disable=SC2034 # start_grpod (tests/lib.sh) runs $GRPOD
GRPOD="$(prog grpod)" GRPOCTL="$(prog grpoctl)"
EP="ipc://$TMP/ctl.sock"
export GRPOD_ENDPOINT="$EP"

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 1 grpo-worker $(keys one) >"$TMP/one.log" 2>&1
expect "one process: $STEPS steps" $?

finished() { state_is finished; }
# released_finishes NAME RANK HOW WHAT: the hold released, NAME's run finishes (HOW), grpod says so and shows rank
# RANK (WHAT) finished; the weights one process's
released_finishes() {
    local name="$1" r="$2" st
    rm -f "$HOLD"
    wait "$JOB"
    expect "$name: the run finishes $3 (mpirun exits 0)" $?
    wait_for 20 finished
    st=$?; expect "$name: grpod says the run finished ($(status_field .state): $(status_field .reason))" "$st"
    field_is ".workers[] | select(.rank == $r) | .state" finished
    st=$?; expect "$name: rank $r ($4) finished ($(status_field ".workers[] | select(.rank == $r) | .state"))" "$st"
    same_as_one "$name"
}

# heartbeats every 0.2 s, lost after 3 s of silence (start_grpod's)
start_grpod g
expect "grpod starts" $?
start_held gr 3 gen:3:2,gen:5:0 grpod.endpoint="$EP" grpod.connect_timeout_s=20
kill_held gr "rank 2 at gen of step 3"
wait_for 60 held_or_ended
lead="$(cat "$HOLD.held" 2>/dev/null)"
[ -n "$lead" ]
expect "gr: the survivors redo step 3 and go on; the lead holds at step 5 (pid ${lead:-none})" $?
survived gr 3 2 2
grpod_saw_survival gr 2 "survived: DP 3 -> 2 at step 3" running,running
"$GRPOCTL" status >"$TMP/status.txt" 2>&1
grep -Eq "^2 .* lost " "$TMP/status.txt" && grep -qF "reason: survived: DP 3 -> 2 at step 3" "$TMP/status.txt"
expect "gr: grpoctl status shows rank 2 lost with its reason" $?

rm -f "$HOLD" # the lead goes on
wait "$JOB"
expect "gr: the run finishes without rank 2 (mpirun exits 0)" $?
wait_for 20 finished
st=$?; expect "gr: grpod says the run finished ($(status_field .state): $(status_field .reason))" "$st"
same_as_one gr

# a spare under grpod (trainer.survive_spare_ranks=1): 4 ranks, launch rank 3 registers as a spare; rank 2 killed
# at step 3's generation, the spare takes its place (DP stays 3), the lead held at step 5 while the status is read
SPARES=1
start_held sp 4 gen:3:2,gen:5:0 grpod.endpoint="$EP" grpod.connect_timeout_s=20
wait_for 150 held_or_ended
field_is ".workers[] | select(.rank == 3) | .role" spare && state_is running
st=$?; expect "sp: grpod shows launch rank 3 as a spare, the run running ($(status_field '[.workers[] | .role] | join(",")'), $(status_field .state))" "$st"
kill_held sp "rank 2 at gen of step 3"
wait_for 60 held_or_ended
[ -s "$HOLD.held" ]
expect "sp: the survivors and the spare redo step 3 and go on; the lead holds at step 5" $?
survived sp 3 2 3
says "$TMP/sp.log" "spare (launch rank 3) joined as DP rank 2 of 3 for step 3"
expect "sp: the spare joined as DP rank 2 of 3" $?
grpod_saw_survival sp 2 "survived: DP 3 -> 3 at step 3" running,running,running
joined_shown() { field_is ".workers[] | select(.rank == 3) | .role" hybrid && field_is ".workers[] | select(.rank == 3) | .dp_rank" 2; }
wait_for 20 joined_shown
st=$?; expect "sp: grpod shows rank 3 as a colocated rank, DP rank 2 ($(status_field '.workers[] | select(.rank == 3) | [.role, .dp_rank] | map(tostring) | join(" dp ")'))" "$st"
status_field '.events[].text' | grep -q "spare rank 3 on host .* took a lost rank's place: DP rank 2 of 3"
expect "sp: grpod's events say the spare took the lost rank's place" $?
released_finishes sp 3 "with the spare in rank 2's place" "the spare that joined"

# a spare never needed under grpod: released at the run's end, shown finished, the run finished
# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 180)" "${MPIRUN[@]}" -np 4 grpo-worker $(keys idle) $(survive_keys 4) grpod.endpoint="$EP" \
    grpod.connect_timeout_s=20 >"$TMP/idle.log" 2>&1
expect "idle: 3 ranks and a spare under grpod, undisturbed (mpirun exits 0)" $?
says "$TMP/idle.log" "spare (launch rank 3) released: the run ended without needing it"
expect "idle: the spare is released at the end" $?
wait_for 20 finished
st=$?; expect "idle: grpod says the run finished ($(status_field .state): $(status_field .reason))" "$st"
[ "$(status_field '[.workers[] | .state] | join(",")')" = finished,finished,finished,finished ]
st=$?; expect "idle: every rank finished, the spare too ($(status_field '[.workers[] | .state] | join(",")'))" "$st"

# TP model copies under grpod: DP 2 x TP 2 on 4 ranks, rank 3 killed at step 3's generation: its copy (launch ranks
# 2 and 3) leaves, rank 2 idle until the run ends; the lead held at step 5 while the status is read
SPARES=0
start_held tpg 4 gen:3:3,gen:5:0 grpod.endpoint="$EP" grpod.connect_timeout_s=20 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2
kill_held tpg "rank 3 at gen of step 3"
wait_for 60 held_or_ended
[ -s "$HOLD.held" ]
expect "tpg: the lead's copy redoes step 3 and goes on; the lead holds at step 5" $?
grpod_saw_survival tpg 3 "survived: DP 2 -> 1 at step 3" running,running,running
idle_shown() { field_is ".workers[] | select(.rank == 2) | .role" idle; }
wait_for 20 idle_shown
st=$?; expect "tpg: grpod shows rank 2 idle ($(status_field '[.workers[] | .role] | join(",")'))" "$st"
status_field '.events[].text' | grep -q "rank 2 on host .* left its model copy and is idle until the run ends: TP rank 0, PP stage 0 of DP rank 1 of 2: its copy lost rank 3 at step 3"
expect "tpg: grpod's events say rank 2 left its model copy, and why" $?
"$GRPOCTL" status >"$TMP/status-tp.txt" 2>&1
grep -Eq "^2 .*idle" "$TMP/status-tp.txt"
expect "tpg: grpoctl status shows rank 2 idle" $?
released_finishes tpg 2 "on the whole copy" "idle"

# Work stealing where a rank may be lost: each host's engines share a lock-free ledger (no MPI one-sided lock). Rank 0
# is made slow to start each generation (test.delay_s, under grpod): the other engines take its unstarted units;
# the weights are one process's all the same (who makes a unit does not change it)
# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 180)" "${MPIRUN[@]}" -np 3 grpo-worker $(keys steal) $(survive_keys 3) grpod.endpoint="$EP" \
    grpod.connect_timeout_s=20 test.delay_phase=gen 'test.delay_s=[1.5,0,0]' >"$TMP/steal.log" 2>&1
expect "steal: 3 ranks under grpod, rank 0 slow at each generation's start (mpirun exits 0)" $?
says "$TMP/steal.log" "an idle engine takes the unstarted units of its host's slowest one (a lock-free ledger"
expect "steal: rank 0 says stealing goes through each host's lock-free ledger" $?
stolen=$(python3 -c 'import json, sys
print(int(sum(json.loads(l).get("colocated/units_stolen", 0) for l in open(sys.argv[1]) if l.strip())))' \
    "$TMP/steal/p/e/metrics.jsonl" 2>&1)
[ "$stolen" -gt 0 ] 2>/dev/null
expect "steal: the others made rank 0's units ($stolen stolen over $STEPS steps)" $?
same_as_one steal
stop_grpod
finish
