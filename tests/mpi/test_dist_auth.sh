#!/usr/bin/env bash
# The data plane's authentication against a hostile peer (issue 27), on a live split run of 2 trainer + 2 rollout
# ranks without grpod (the run key made by world rank 0 and handed out over MPI):
#  - an undisturbed run, for reference;
#  - the same run held at step 1 (the rollout ranks' scorer holds each sample until a file goes) while the hostile
#    client (data_stranger --dispatch), holding the good credentials of one extra process of rollout rank 1
#    (GRPO_TEST_SPARE_CREDENTIALS), tries: an unauthenticated batch, a batch MAC'd with that key claiming another
#    rank or another process, a batch naming another rank as its sender, a captured batch replayed; on the
#    dispatcher an unauthenticated ping, a ping and a work claim for rollout rank 0, and a weights download without
#    credentials. Each is refused for its reason; the run finishes with weights bit-identical to the undisturbed
#    run's. Once on ipc sockets, once on tcp (grpod.data_endpoint=tcp://*:PORT, no grpod.secret_file);
#  - a hostile flood of the dispatcher on tcp (issue 39 item 4; see "the hostile flood" below).
# usage: test_dist_auth.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/dist_lib.sh" grpo-dist-auth
STRANGER="$(prog data-stranger)"
STEPS=3
COMMON=(actor_rollout_ref.model.path="$TMP/tiny" trainer.project_name=p trainer.experiment_name=e
    trainer.total_training_steps=$STEPS trainer.val_before_train=false trainer.test_freq=-1
    data.train_batch_size=4 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2
    data.max_response_length=12 actor_rollout_ref.actor.optim.lr=1e-3 data.synthetic.shots=0 data.synthetic.num_train=64
    data.synthetic.num_val=4 custom_reward_function.path="$SCORER" placement.trainer_ranks=2
    placement.rollout_ranks=2)
weights() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor"; }

timeout "$(scaled 300)" "${MPIRUN[@]}" -np 4 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/quiet" \
    custom_reward_function.name=byte_score >"$TMP/quiet.log" 2>&1
expect "2 trainer + 2 rollout ranks finish, every message authenticated" $?

# hostile NAME DATA_BASE DP0 DISPATCH READY...: the held run with the hostile peer, its data plane at DATA_BASE
# (grpod.data_endpoint), trainer DP rank 0's socket at DP0 and the dispatcher's at DISPATCH; READY...: a command
# that succeeds once both sockets listen
hostile() {
    local name="$1" base="$2" dp0="$3" disp="$4"; shift 4
    touch "$TMP/hold"
    rm -f "$TMP/spare.cred"
    timeout "$(scaled 300)" "${MPIRUN[@]}" -x GRPO_TEST_HOLD_FILE="$TMP/hold" -x GRPO_TEST_SPARE_CREDENTIALS="$TMP/spare.cred" \
        -np 4 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/$name" grpod.data_endpoint="$base" \
        custom_reward_function.name=held_byte_score >"$TMP/$name.log" 2>&1 &
    local run=$!
    wait_for 30 "$@"; expect "$name: trainer DP rank 0's data socket and the dispatcher's listen" $?
    "$STRANGER" "$dp0" 0 --cred "$TMP/spare.cred" --dispatch "$disp" "${COMMON[@]}" >"$TMP/$name.stranger.log" 2>&1
    local rc=$? # before the command substitution in the message, which would reset $?
    expect "$name: every forgery, replay and unauthenticated request is refused ($(grep -c "^auth: " \
        "$TMP/$name.stranger.log") probes)" $rc
    check() { grep -q "^auth: $1: .*$2" "$TMP/$name.stranger.log"; expect "$name: $1: refused ($2)" $?; }
    check "an unauthenticated batch" "carries no authentication"
    check "a batch MAC'd with one process's key claiming another's rank" "authentication failed"
    check "a batch claiming another process of the same rank" "authentication failed"
    check "a batch whose from_rank is another rank than its credentials'" "no process speaks for another"
    check "the captured batch replayed" "a replayed message"
    check "an unauthenticated ping for rollout rank 0" "carries no authentication"
    check "a ping for rollout rank 0 from rollout rank 1's process" "no process speaks for another"
    check "a claim of rollout rank 0's work from rollout rank 1's process" "no process speaks for another"
    check "a weights download without credentials" "carries no authentication"
    rm -f "$TMP/hold"
    wait $run
    expect "$name: the run with the hostile peer finishes" $?
    grep -q "refused a ping for rollout rank 0 from a process authenticated as world rank 3" "$TMP/$name.log"
    expect "$name: the dispatcher logs the forged ping" $?
    "$COMPARE" "$(weights quiet)" "$(weights "$name")" 0 >/dev/null 2>&1
    expect "$name: the hostile peer changed nothing (weights bit-identical to the undisturbed run)" $?
}

# on ipc sockets
hostile hostile "ipc://$TMP/data" "ipc://$TMP/data-dp0.sock" "ipc://$TMP/data-dispatch.sock" \
    sh -c "test -S '$TMP/data-dp0.sock' && test -S '$TMP/data-dispatch.sock'"
# on tcp, as across hosts (no grpod.secret_file: the data plane is authenticated all the same): trainer DP ranks
# at PORT and PORT+1, the dispatcher at PORT+2 (below the ephemeral ports: no outgoing connection holds them)
PORT=$(( 10000 + RANDOM % 20000 ))
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
hostile hostile_tcp "tcp://*:$PORT" "tcp://127.0.0.1:$PORT" "tcp://127.0.0.1:$((PORT + 2))" \
    bash -c "$(declare -f listening); listening $PORT && listening $((PORT + 2))"

# the hostile flood (issue 39 item 4), on tcp with weight_sync=broadcast: data_stranger --flood holds one process's
# key (rollout rank 1's spare, of the real processes' generation) and floods the dispatcher for 8 s from the held
# step 1 on (the run goes on after 4 s, two heartbeat intervals past): its own key's pings under 300 phantom ids and
# for rank 0, 48 MiB envelopes with a fake MAC, 60 KiB and 600-byte requests with a fake MAC, small ones with a fake
# MAC. No phantom is registered (a second process of a live one's generation, or over the key's rate), the requests
# over their kind's size are refused before any MAC and cost the dispatcher a few microseconds of CPU each (its own
# count at close), the real rollout processes are never lost, every version still goes in a broadcast, and the
# weights are bit-identical to the undisturbed run's.
FPORT=$(( 10000 + RANDOM % 20000 ))
touch "$TMP/hold"
rm -f "$TMP/spare.cred"
timeout "$(scaled 300)" "${MPIRUN[@]}" -x GRPO_TEST_HOLD_FILE="$TMP/hold" -x GRPO_TEST_SPARE_CREDENTIALS="$TMP/spare.cred" \
    -np 4 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/flood" grpod.data_endpoint="tcp://*:$FPORT" \
    actor_rollout_ref.rollout.weight_sync=broadcast \
    custom_reward_function.name=held_byte_score >"$TMP/flood.log" 2>&1 &
run=$!
wait_for 30 bash -c "$(declare -f listening); listening $FPORT && listening $((FPORT + 2)) && test -s '$TMP/spare.cred'"
expect "flood: the dispatcher listens on tcp" $?
# both real rollout processes first (they ping once their client is up, before the model is loaded)
serving() { [ "$(grep -c "dispatch: rollout process .* serves rollout rank" "$TMP/flood.log")" -ge 2 ]; }
wait_for 60 serving; expect "flood: both real rollout processes are at the dispatcher" $?
"$STRANGER" "tcp://127.0.0.1:$FPORT" 0 --cred "$TMP/spare.cred" --flood "tcp://127.0.0.1:$((FPORT + 2))" 8 \
    "${COMMON[@]}" >"$TMP/flood.stranger.log" 2>&1 &
flooder=$!
sleep 4 # sleep-ok: the flood goes on past two heartbeat intervals (a silent process is lost after two) while held
rm -f "$TMP/hold"
wait $flooder
rc=$?
expect "flood: every phantom, oversized and forged request refused for its reason ($(grep "^flood: [0-9]" \
    "$TMP/flood.stranger.log"))" $rc
grep -q "^flood: [1-9][0-9]* phantom pings of one key (0 served)" "$TMP/flood.stranger.log"
expect "flood: one key registers no phantom" $?
wait $run
expect "flood: the run under the flood finishes" $?
! grep -q "rollout process .* lost: silent" "$TMP/flood.log"; expect "flood: no real rollout process is declared lost" $?
! grep -q "weight broadcast off\|giving the group up" "$TMP/flood.log"; expect "flood: the broadcast stays on" $?
n=$(grep -c "broadcast to 2 rollout process(es) over mpi: [0-9]* bytes" "$TMP/flood.log")
[ "$n" -eq "$STEPS" ]; expect "flood: every version a step needs goes in a broadcast ($n of $STEPS rounds)" $?
# the dispatcher's account at close: requests refused by their size before any MAC, its CPU for each, the MACs
summary="$(grep "dispatch: requests refused:" "$TMP/flood.log" | tail -1)"
python3 - "$summary" "$(grep "^flood: [0-9]" "$TMP/flood.stranger.log")" <<'PY'
import re, sys
d, f = sys.argv[1], sys.argv[2]
size = int(re.search(r"\((\d+) by their size before any MAC", d).group(1))
second = int(re.search(r"(\d+) second processes", d).group(1))
limited = int(re.search(r"(\d+) rate limited", d).group(1))
macs, mac_bytes = map(int, re.search(r"(\d+) MACs over (\d+) bytes", d).groups())
cheap, each, most = re.search(r"(\d+) refused before any MAC took ([\d.]+) us of CPU each \(at most ([\d.]+)\)", d).groups()
dropped = int(re.search(r"(\d+) connections dropped by the socket", d).group(1))
sent_sized = int(re.search(r"(\d+) requests over their kind's size", f).group(1))
unanswered = int(re.search(r"(\d+) unanswered", f).group(1))
bigs = int(re.search(r"(\d+) envelopes of 48 MiB sent", f).group(1))
print("flood: %d refused by size (%d sent, %d unanswered), %d second processes, %d rate limited, %d MACs over %d bytes, %s refused "
      "before a MAC at %s us of CPU each (at most %s), %d connections dropped (%d envelopes of 48 MiB)"
      % (size, sent_sized, unanswered, second, limited, macs, mac_bytes, cheap, each, most, dropped, bigs))
assert size + unanswered >= sent_sized > 0, "every request over its kind's size refused by it"
assert second + limited > 0, "the phantoms were refused"
assert mac_bytes <= 512 * macs, "no MAC over more than a request's bound"
assert float(each) < 200, "constant work per refused request (a MAC of 48 MiB takes some 100000 us)"
assert bigs == 0 or dropped > 0, "the 48 MiB envelopes were dropped by the socket"
PY
expect "flood: each flood message cost the dispatcher a bounded amount ($summary)" $?
"$COMPARE" "$(weights quiet)" "$(weights flood)" 0 >/dev/null 2>&1
expect "flood: weights bit-identical to the undisturbed run" $?

finish "$TMP"/quiet.log "$TMP"/hostile*.log "$TMP"/flood.log
