#!/usr/bin/env bash
# grpod + grpoctl + simulated workers: registration and role assignment, status
# (table and JSON), workers, metrics, pause/resume with bit-identical results,
# checkpoint, stop, and grpoctl's errors and exit codes.
set -u
. "$(dirname "$0")/grpod_lib.sh"

# ---- grpoctl without grpod: clear error, exit 3, quickly
"$GRPOCTL" --retries 2 status >"$TMP/err" 2>&1
rc=$?
[ $rc -eq 3 ]; expect "no grpod: exit 3 (got $rc)" $?
has "$TMP/err" "cannot reach grpod at $EP: no such file or directory"; expect "no grpod: says why" $?
"$GRPOCTL" --help >"$TMP/help" 2>&1; expect "grpoctl --help exits 0" $?
has "$TMP/help" "GRPOD_ENDPOINT"; expect "--help documents GRPOD_ENDPOINT" $?
"$GRPOCTL" frobnicate >"$TMP/err" 2>&1; [ $? -eq 2 ]; expect "unknown command exits 2" $?
"$GRPOCTL" --endpoint inproc://x status >"$TMP/err" 2>&1; [ $? -eq 2 ]; expect "bad endpoint exits 2" $?
"$GRPOD" --help >"$TMP/help" 2>&1; expect "grpod --help exits 0" $?
"$GRPOD" grpod.endpoint=tcp://127.0.0.1:1 grpod.state_dir="$TMP/x" >"$TMP/err" 2>&1; [ $? -eq 2 ]
expect "grpod: tcp without a secret file exits 2" $?
has "$TMP/err" "grpod.secret_file"; expect "grpod: says to set grpod.secret_file" $?

# ---- a reference run without grpod: the state a pause must not change
"$SIM" --rank 0 --world 1 --steps 12 --step-ms 20 --state "$TMP/ref.state" >"$TMP/ref.log" 2>&1
expect "sim worker alone runs" $?

# ---- placement: 1 trainer + 1 rollout rank
start_grpod g1 placement.trainer_ranks=1 placement.rollout_ranks=1
expect "grpod starts and answers" $?
state_is waiting; expect "run waits for workers" $?
[ "$(stat -c %a "$TMP/ctl.sock")" = 660 ]; expect "ipc socket has mode 0660" $?
start_sim w0 0 2 --steps 1000 --step-ms 50 --host hostA
start_sim w1 1 2 --steps 1000 --step-ms 50 --host hostB --caps rollout
wait_for 15 state_is running; expect "run runs once both ranks registered" $?
[ "$(status_field '.workers[0].role')" = trainer ]; expect "rank 0 is the trainer" $?
[ "$(status_field '.workers[1].role')" = rollout ]; expect "rank 1 is a rollout worker" $?
[ "$(status_field '.workers[1].host')" = hostB ]; expect "host reported" $?
"$GRPOCTL" status >"$TMP/status" 2>&1; expect "grpoctl status exits 0" $?
has "$TMP/status" "RANK  HOST"; expect "status prints the worker table" $?
grep -Eq '^1 +hostB +[0-9]+ +rollout +0/0/0 +(running|starting)' "$TMP/status"; expect "worker row: rank host pid role coords state" $?
has "$TMP/status" "state       running"; expect "status shows the run state" $?
"$GRPOCTL" workers >"$TMP/workers" 2>&1; expect "grpoctl workers exits 0" $?
has "$TMP/workers" "hostA"; expect "workers lists hostA" $?
"$GRPOCTL" workers --json | jq -e 'length == 2' >/dev/null; expect "workers --json is a list of 2" $?
wait_for 10 step_at_least 3; expect "steps advance" $?
"$GRPOCTL" metrics >"$TMP/metrics" 2>&1; expect "grpoctl metrics exits 0" $?
has "$TMP/metrics" 'grpod_run_state{state="running"} 1'; expect "metrics show the state" $?
has "$TMP/metrics" 'grpo_run_metric{name="critic/score/mean"}'; expect "metrics carry verl names" $?
# a wrong world size is refused with a reason
"$SIM" grpod.endpoint="$EP" grpod.connect_timeout_s=3 --rank 0 --world 3 --state "$TMP/bad.state" >"$TMP/bad.log" 2>&1
[ $? -eq 1 ]; expect "a worker with the wrong world size is refused" $?
has "$TMP/bad.log" "placement has 2"; expect "refusal names the placement" $?
"$GRPOCTL" stop --wait="$(scaled 30)" >"$TMP/out" 2>&1; expect "stop --wait ends the run" $?
has "$TMP/out" "run finished"; expect "stop reports the finished run" $?
wait "${PIDS[1]%:*}" "${PIDS[2]%:*}"
[ -f "$TMP/w0.state.ckpt" ]; expect "stop wrote a checkpoint" $?
state_is finished; expect "run finished" $?
"$GRPOCTL" pause >"$TMP/err" 2>&1; [ $? -eq 1 ]; expect "pause of a finished run: exit 1" $?
has "$TMP/err" "nothing to pause"; expect "refusal says why" $?
stop_grpod; expect "grpod stops on SIGTERM with 0" $?
[ ! -e "$TMP/ctl.sock" ]; expect "socket file removed" $?

# ---- hybrid single process: pause and resume keep the result bit-identical
start_grpod g2
start_sim h0 0 1 --steps 12 --step-ms 60
wait_for 10 state_is running; expect "hybrid run runs" $?
[ "$(status_field '.workers[0].role')" = hybrid ]; expect "single process gets the hybrid role" $?
wait_for 10 step_at_least 2
"$GRPOCTL" pause --wait="$(scaled 20)" >"$TMP/out" 2>&1; expect "pause --wait returns once paused" $?
has "$TMP/out" "run paused"; expect "pause reports paused" $?
s1="$(status_field .step)"
[ "$(status_field '.workers[0].state')" = paused ]; expect "worker reports paused" $?
age="$(status_field '.workers[0].last_heartbeat_age_s')"
awk "BEGIN{exit !($age < 1.5)}"; expect "heartbeats continue while paused (age $age s)" $?
"$GRPOCTL" checkpoint --wait="$(scaled 20)" >"$TMP/out" 2>&1; expect "checkpoint while paused" $?
has "$TMP/out" "checkpoint written: step $s1"; expect "checkpoint at the paused step" $?
"$GRPOCTL" resume --wait="$(scaled 20)" >"$TMP/out" 2>&1; expect "resume" $?
wait_for 10 has "$TMP/h0.log" "resumed at step"; expect "the worker says it resumed" $?
paused_in_place "$TMP/h0.log" && has "$TMP/h0.log" "resumed at step $s1"
expect "no steps while paused: paused and resumed at step $s1" $?
wait "$SIM_PID"; expect "sim worker finishes after resume" $?
wait_for 10 state_is finished; expect "run finished after the last step" $?
cmp -s "$TMP/ref.state" "$TMP/h0.state"; expect "state after pause/resume is bit-identical" $?
has "$TMP/g2.state/events.log" "pause requested"; expect "events.log records the pause" $?

# ---- a worker that fails: the run fails with its reason
start_sim f0 0 1 --steps 50 --step-ms 20 --fail-at 3 --host hostF
# a finished run: the next registration begins a new run
wait_for 15 state_is failed; expect "run fails when its worker fails" $?
[ "$(status_field .reason)" = "rank 0 on host hostF failed: simulated failure at step 3" ]
expect "reason names rank, host and error" $?
stop_grpod

# ---- the newest checkpoint any worker wrote shows, whoever asked for it: here rank 1 fails before any
# checkpoint, and rank 0 writes one as the failed run tells it to stop (no checkpoint request was made)
start_grpod g4
start_sim c0 0 2 --steps 100000 --step-ms 30 --host hostC
C0=$SIM_PID
start_sim c1 1 2 --steps 100000 --step-ms 30 --host hostD --fail-at 4
wait_for 15 state_is failed; expect "run fails when rank 1 fails" $?
wait "$C0"
cstep="$(sed -n 's/.*checkpoint at step \([0-9]*\) written.*/\1/p' "$TMP/c0.log" | tail -n1)"
[ -n "$cstep" ]; expect "rank 0 wrote a checkpoint as it stopped (step $cstep)" $?
wait_for 5 field_is '.workers[0].checkpoint_step' "$cstep"
expect "grpod knows rank 0's checkpoint" $?
"$GRPOCTL" status >"$TMP/status" 2>&1
grep -q "^checkpoint  step $cstep written by rank 0, not by every worker (requests 0)" "$TMP/status"; r=$?
expect "grpoctl status shows it: $(grep '^checkpoint' "$TMP/status")" $r
stop_grpod

# ---- sd_notify: readiness, status and stopping reach $NOTIFY_SOCKET (as under systemd)
if "$GRPOD" --version | grep -q sd_notify; then
    python3 - "$TMP/notify.sock" "$TMP/notify.txt" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(1.0)
end = time.time() + 15
with open(sys.argv[2], "w") as out:
    while time.time() < end:
        try:
            out.write(s.recv(4096).decode() + "\n")
            out.flush()
        except socket.timeout:
            pass
PY
    track $!
    wait_for 5 test -S "$TMP/notify.sock"
    NOTIFY_SOCKET="$TMP/notify.sock" start_grpod g3
    wait_for 5 grep -q '^READY=1' "$TMP/notify.txt"; expect "sd_notify READY=1" $?
    grep -q '^STATUS=run run-.* waiting, step 0, 0 of 0 workers' "$TMP/notify.txt"; expect "sd_notify STATUS" $?
    stop_grpod
    wait_for 5 grep -q '^STOPPING=1' "$TMP/notify.txt"; expect "sd_notify STOPPING=1 on SIGTERM" $?
else
    echo "skip sd_notify checks (grpod built without libsystemd)"
fi
finish
