#!/usr/bin/env bash
# What a passive reader of the network between the hosts gets, and what replaying it does (issue 39, items 2 and 3).
# Three namespace hosts (hosts_lib.sh): grpod on hostc on TCP with its secret, a split run under it (the trainer on
# hosta, the rollout rank on hostb, the data plane over TCP at grpod.data_endpoint), and every frame of the three
# hosts' links captured in the root namespace (capture.py: AF_PACKET on their veth ends, both ways), from before the
# first registration to the end:
#  - the capture holds neither the secret nor any data-plane key of either launch (the run key the trainer's
#    Assignment carries, the rollout process's own key), raw or as hex, although both launches registered over TCP
#    and took them (the capture's own working is checked on the SP protocol header, found);
#  - a `grpoctl pause` captured whole and replayed from another host after `grpoctl resume`: its hello gets a
#    challenge of its own (not the captured nonce), its sealed pause is refused as a replay, counted
#    (grpod_rejected_requests_total{reason="replay"}) and logged, and the run stays running;
#  - launch 1 killed (every process on hosta and hostb) and the job launched again: grpod gives launch 2 a fresh run
#    key at key epoch 2; the rollout process's requests to the dispatcher captured in launch 1, replayed into launch
#    2's dispatcher, are each refused for their key epoch, counted (dataplane/refused_old_epoch in the trainer's
#    metrics) and logged at most once per 5 s; launch 2 finishes.
# Root only (network namespaces): skipped with the reason otherwise.
# usage: test_capture.sh (the build's programs by name, tests/lib.sh)
. "$(dirname "$0")/hosts_lib.sh" grpo-capture
GRPOD="$(prog grpod)" GRPOCTL="$(prog grpoctl)"
CAP="$SRC_ROOT/tests/cluster/net/capture.py"
HOST_PROGRAMS=("$GRPOD" "$GRPOCTL" "$WORKER") HOST_FILES=("$SCORER" "$CAP")
command -v python3 >/dev/null || skip "the capture needs python3"
hosts_up || finish

tiny_model "$TMP/tiny"
expect "tiny model initialised" $?
STEPS=2
DPORT=$((20000 + RUN_ID % 10000)) # the trainer's data socket; the dispatcher's is DPORT+1 (one trainer DP rank)
keys() {
    echo actor_rollout_ref.model.path="$TMP/tiny" trainer.default_local_dir="$TMP/run" trainer.project_name=p \
        trainer.experiment_name=e trainer.total_training_steps=$STEPS trainer.val_before_train=false \
        trainer.test_freq=-1 trainer.save_freq=1 data.train_batch_size=4 actor_rollout_ref.rollout.n=4 \
        actor_rollout_ref.actor.ppo_mini_batch_size=2 data.max_response_length=12 actor_rollout_ref.actor.optim.lr=1e-3 \
        data.synthetic.shots=0 data.synthetic.num_train=64 data.synthetic.num_val=4 custom_reward_function.path="$SCORER" \
        custom_reward_function.name=held_byte_score placement.trainer_ranks=1 placement.rollout_ranks=1 \
        trainer.log_level=info
}
now() { date +%s.%N; }
ctl_json() { on hostc "$GRPOCTL" status --json 2>/dev/null; }
state() { ctl_json | jq -r .state; }
both_running() { [ "$(ctl_json | jq '[.workers[] | select(.state == "running")] | length')" = 2 ]; }
# journal_caught_up: grpod's journal snapshot (run.json: a registration is first a line appended to run.log, and the
# next run.json holds it, docs/operations.md) holds the running ranks as grpoctl shows them (rank and pid)
journal_caught_up() {
    local shown kept
    shown="$(ctl_json | jq -c '[.workers[] | select(.state == "running") | {rank, pid}] | sort_by(.rank)')"
    kept="$(jq -c '[.workers[] | select(. != null) | {rank, pid}] | sort_by(.rank)' "$JOURNAL" 2>/dev/null)"
    [ -n "$shown" ] && [ "$shown" != "[]" ] && [ "$shown" = "$kept" ]
}
# launch NAME: the job (the trainer on hosta, the rollout rank on hostb), its samples held while $TMP/hold exists
launch() {
    # shellcheck disable=SC2046
    on hosta "${MPIRUN_NET[@]}" --mca orte_enable_recovery 1 -x GRPO_TEST_HOLD_FILE="$TMP/hold" \
        --host hosta:1,hostb:1 -np 2 "$WORKER" $(keys) grpod.endpoint="$EP" grpod.secret_file="$SECRET" \
        grpod.connect_timeout_s=30 >>"$TMP/$1.log" 2>&1 &
    MPI_PID=$!
    track "$MPI_PID"
}

# the capture: every frame of the three hosts' links, from before grpod starts to the end
python3 "$CAP" capture "$TMP/all.pcap" "$(veth_of hosta)" "$(veth_of hostb)" "$(veth_of hostc)" >"$TMP/cap.log" 2>&1 &
CAP_PID=$!
track "$CAP_PID"
wait_for 10 has "$TMP/cap.log" capturing; expect "capturing the links of hosta, hostb and hostc" $?
grpod_up hostc grpod.heartbeat_interval_s=0.5 grpod.heartbeat_timeout_s=4 grpod.data_endpoint="tcp://*:$DPORT"
expect "grpod on hostc, TCP with its secret" $?
JOURNAL="$TMP/grpod.$GRPOD_N.state/run.json"

# ---- launch 1, held at its first step's scoring
touch "$TMP/hold"
T1=$(now)
launch launch1
wait_alive 120 "$MPI_PID" both_running; expect "launch 1: the trainer (hosta) and the rollout rank (hostb) run" $?
wait_for 30 journal_caught_up; expect "grpod's journal snapshot holds launch 1's ranks" $?
cp "$JOURNAL" "$TMP/run1.json"
# launch 1's requests to the dispatcher (the rollout process on hostb to the trainer on hosta), a few captured (it
# pings every 0.5 s)
disp_captured() {
    rm -f "$TMP"/disp.*
    local n
    n=$(python3 "$CAP" stream "$TMP/all.pcap" "$(ip_of hostb)" "$(ip_of hosta)" $((DPORT + 1)) "$T1" "$(now)" "$TMP/disp")
    [ "$n" -ge 1 ] 2>/dev/null && [ "$(python3 "$CAP" messages "$TMP"/disp.*.c)" -ge 6 ]
}
wait_for 60 disp_captured; expect "the capture holds launch 1's requests to the dispatcher" $?

# ---- grpoctl pause, captured, then replayed from hostb after the run resumed
TP0=$(now)
on hosta "$GRPOCTL" pause >"$TMP/pause.out" 2>&1; expect "grpoctl pause (from hosta) is answered" $?
TP1=$(now)
on hosta "$GRPOCTL" resume >/dev/null 2>&1; expect "grpoctl resume" $?
running() { [ "$(state)" = running ]; }
wait_for 10 running; expect "the run runs again" $?
pause_captured() {
    [ "$(python3 "$CAP" stream "$TMP/all.pcap" "$(ip_of hosta)" "$(ip_of hostc)" "${EP##*:}" "$TP0" "$TP1" \
        "$TMP/pause")" = 1 ] && [ "$(python3 "$CAP" messages "$TMP/pause.0.c")" -ge 2 ]
}
wait_for 10 pause_captured; expect "the capture holds grpoctl pause's connection (a hello, a sealed request)" $?
on hostb python3 "$CAP" replay "$(ip_of hostc)" "${EP##*:}" "$TMP/pause.0.c" "$TMP/pause.0.s" >"$TMP/replay-pause.out" 2>&1
grep -q "^answer 0: challenge " "$TMP/replay-pause.out"; expect "the replayed hello is challenged" $?
grep -q "^challenge: fresh" "$TMP/replay-pause.out"; expect "... with a fresh nonce, not the captured one" $?
grep -q "^answer 1: reply a replayed request" "$TMP/replay-pause.out"
st=$?; expect "the replayed sealed pause is refused as a replay ($(grep -m1 "^answer 1" "$TMP/replay-pause.out"))" "$st"
[ "$(state)" = running ]; expect "the run is still running (not pausing)" $?
on hostc "$GRPOCTL" metrics 2>/dev/null | grep -Eq 'grpod_rejected_requests_total\{reason="replay"\} [1-9]'
expect "grpod counts the replay" $?
grep -q "refused a sealed request: a replayed request" "$TMP/grpod.log"; expect "grpod logs the replay" $?

# ---- launch 1 ends (every process on hosta and hostb killed), launch 2 (the same job again)
TE1=$(now)
for h in hosta hostb; do ip netns pids "$NS_PREFIX-$h" | xargs -r kill -9; done
wait "$MPI_PID" 2>/dev/null
lost2() { [ "$(ctl_json | jq '[.workers[] | select(.state == "lost")] | length')" -ge 1 ]; }
wait_for 20 lost2; expect "grpod finds launch 1's ranks lost" $?
# (the kill took the hosts' sshd too: mpirun starts launch 2's daemons through it)
host_services hosta && host_services hostb; expect "hosta's and hostb's services up again" $?
launch launch2
wait_alive 120 "$MPI_PID" both_running; expect "launch 2 runs" $?
ctl_json | jq -r '.events[].text' | grep -q "a new launch of run .*epoch 2 (the keys of the launch before are dead)"
expect "grpod gives launch 2 a fresh data-plane key at epoch 2" $?
wait_for 30 journal_caught_up; expect "grpod's journal snapshot holds launch 2's ranks" $?
cp "$JOURNAL" "$TMP/run2.json"
[ "$(jq -r .run.plane_key "$TMP/run1.json")" != "$(jq -r .run.plane_key "$TMP/run2.json")" ]
expect "launch 2's run key is not launch 1's" $?

# launch 1's requests to the dispatcher, replayed into launch 2's (the same address: the port follows the run)
n=$(python3 "$CAP" stream "$TMP/all.pcap" "$(ip_of hostb)" "$(ip_of hosta)" $((DPORT + 1)) "$T1" "$TE1" "$TMP/disp")
[ "$n" -ge 1 ] 2>/dev/null; expect "launch 1's dispatcher connections: $n" $?
R0=$(now)
for ((i = 0; i < ${n:-0}; i++)); do
    on hostb python3 "$CAP" replay "$(ip_of hosta)" $((DPORT + 1)) "$TMP/disp.$i.c" >>"$TMP/replay-disp.out" 2>&1
done
R1=$(now)
sent=$(grep -c "^answer " "$TMP/replay-disp.out")
epoch_refused=$(grep -c "^answer [0-9]*: reply a message of key epoch 1, not this launch's (2)" "$TMP/replay-disp.out")
[ "$sent" -ge 3 ] && [ "$epoch_refused" = "$sent" ]
expect "each of launch 1's $sent requests replayed is refused for its key epoch ($epoch_refused)" $?
lines=$(grep -c "refused a [a-z_]* claiming world rank 1: a message of key epoch 1" "$TMP/launch2.log")
most=$(awk -v a="$R0" -v b="$R1" 'BEGIN { printf "%d", (b - a) / 5 + 2 }')
[ "$lines" -ge 1 ] && [ "$lines" -le "$most" ]
expect "the dispatcher logs them at most once per 5 s ($lines lines for $sent refusals)" $?

rm -f "$TMP/hold"
wait "$MPI_PID"; rc=$?
expect "launch 2 finishes (mpirun exit $rc)" $rc
[ "$(state)" = finished ]; expect "the run finished" $?
counted=$(tail -n 1 "$TMP/run/p/e/metrics.jsonl" 2>/dev/null | jq -r '."dataplane/refused_old_epoch"')
[ "${counted%.*}" -ge "$sent" ] 2>/dev/null
expect "the trainer's metrics count them (dataplane/refused_old_epoch $counted)" $?

# ---- what the capture holds
kill -TERM "$CAP_PID"
wait "$CAP_PID"
python3 "$CAP" flows "$TMP/all.pcap" >"$TMP/flows.txt"
grep -q "^$(ip_of hostb):[0-9]* > $(ip_of hostc):${EP##*:} " "$TMP/flows.txt" &&
    grep -q "^$(ip_of hosta):[0-9]* > $(ip_of hostc):${EP##*:} " "$TMP/flows.txt"
expect "the ranks of both hosts registered with grpod over the captured links" $?
python3 "$CAP" keys "$TMP/run1.json" "$SECRET" >"$TMP/keys1.json" &&
    python3 "$CAP" keys "$TMP/run2.json" "$SECRET" >"$TMP/keys2.json" &&
    jq -s 'add + {"control: the SP protocol header": "00535000"}' "$TMP/keys1.json" "$TMP/keys2.json" >"$TMP/needles.json"
expect "the needles: the secret, both launches' run keys and every process's key" $?
python3 "$CAP" find "$TMP/all.pcap" "$TMP/needles.json" >"$TMP/find.out" 2>&1
rc=$?
sed 's/^/     | /' "$TMP/find.out"
grep -q "^found control: the SP protocol header" "$TMP/find.out"; expect "the capture works (it finds the SP header)" $?
[ "$(grep -c "^absent rank [01]'s key" "$TMP/find.out")" -ge 4 ]; expect "two processes' keys per launch searched" $?
[ $rc -eq 0 ]; expect "nothing captured holds the secret or a data-plane key, raw or as hex" $rc
finish
