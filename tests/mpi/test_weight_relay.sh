#!/usr/bin/env bash
# actor_rollout_ref.rollout.weight_relay_fanout: the weight relay tree. 1 trainer + 4 rollout ranks, on-policy, each
# run against the same run with the tree off (every rollout process fetches every version from trainer rank 0):
#  - fan-out 1 (a chain: rank 0 -> a -> b -> c -> d) and fan-out 2: bit-identical checkpoints; trainer rank 0 serves
#    exactly k copies of each version (its dispatcher's count, logged per version, and perf/update_weights_bytes),
#    the reference 4; the other copies come from the rollout processes' relays, whose bytes they log;
#  - hostile relays: every relay flips a bit of what it serves (GRPO_TEST_RELAY_CORRUPT_RANK=all), or never answers
#    (GRPO_TEST_RELAY_SILENT_RANK=all): each receiver finds the digest wrong (or the relay silent), fetches from rank
#    0 and names the relay, which the dispatcher never names again (each relay fails at most one receiver); no
#    version is taken from a relay; the weights are still bit-identical;
#  - one corrupt relay (rollout rank 0's) among good ones: never taken, barred at most once, bit-identical;
#  - one step off (rollout.mode=async), fan-out 1: bit-identical to the same mode with the tree off.
# The dispatcher's tree assignment is unit-tested in tests/unit/test_dispatch.c (test_relay_tree).
# usage: test_weight_relay.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/dist_lib.sh" grpo-relay
STEPS=3
COMMON=(actor_rollout_ref.model.path="$TMP/tiny" trainer.project_name=p trainer.experiment_name=e
    trainer.total_training_steps=$STEPS trainer.val_before_train=false trainer.test_freq=-1
    data.train_batch_size=4 actor_rollout_ref.rollout.n=2 actor_rollout_ref.actor.ppo_mini_batch_size=2
    data.max_response_length=8 actor_rollout_ref.actor.optim.lr=1e-3 data.synthetic.shots=0 data.synthetic.num_train=64
    data.synthetic.num_val=4 actor_rollout_ref.rollout.update_weights_bucket_megabytes=1 trainer.log_level=debug
    custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score
    placement.trainer_ranks=1 placement.rollout_ranks=4)
weights() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor"; }
run() { # NAME MPI-OPTIONS... -- EXTRA...
    local name="$1" mpi=()
    shift
    while [ "$1" != -- ]; do mpi+=("$1"); shift; done
    shift
    timeout "$(scaled 400)" "${MPIRUN[@]}" "${mpi[@]}" -np 5 "$WORKER" "${COMMON[@]}" \
        trainer.default_local_dir="$TMP/$name" "$@" >"$TMP/$name.log" 2>&1
}
# the copies trainer rank 0 served of each version, as its dispatcher logs them: "V:COPIES" a line
copies() { grep -o "policy version [0-9]*: [0-9]* weight bytes served from here ([0-9.]* copies)" "$TMP/$1.log" |
    sed 's/policy version \([0-9]*\): [0-9]* weight bytes served from here (\([0-9.]*\) copies)/\1:\2/' | sort; }
relayed() { grep -c "chunk(s) from rollout rank [0-9]*'s relay" "$TMP/$1.log"; }
# the dispatcher's own order (one thread): no relay is named ("takes it from rollout rank R's relay") after it was
# barred ("rollout rank R's weight relay failed ...: it is never named a relay again"), and each is barred once
never_again() { # NAME
    grep "\[rank 0\] dispatch: " "$TMP/$1.log" | awk '
        /takes it from rollout rank [0-9]*.s relay/ { match($0, /from rollout rank [0-9]*/); r = substr($0, RSTART + 18, RLENGTH - 18)
            if (r in barred) { print "named after it was barred: " $0; bad = 1 } }
        /it is never named a relay again/ { match($0, /rollout rank [0-9]*.s weight relay failed/); r = substr($0, RSTART + 13, RLENGTH - 13)
            sub(/.s weight relay failed/, "", r); if (r in barred) { print "barred twice: " r; bad = 1 }; barred[r] = 1; n++ }
        END { if (!n) { print "nothing barred"; bad = 1 }; exit bad }'
}
identical() { # NAME
    "$COMPARE" "$(weights ref)" "$(weights "$1")" 0 >"$TMP/cmp-$1.txt" 2>&1
}

run ref -- actor_rollout_ref.rollout.weight_relay_fanout=0
expect "reference: the tree off, 1 trainer + 4 rollout ranks, finishes" $?
ref="$(copies ref | tr '\n' ' ')"
[ "$ref" = "0:4.00 1:4.00 2:4.00 " ]; expect "reference: rank 0 serves 4 copies of each version ($ref)" $?
[ "$(relayed ref)" -eq 0 ]; expect "reference: nothing from a relay" $?

for k in 1 2; do
    run "k$k" -- actor_rollout_ref.rollout.weight_relay_fanout=$k
    expect "fan-out $k finishes" $?
    grep -q "policy versions go through the weight relay tree of fan-out $k" "$TMP/k$k.log"
    expect "fan-out $k: the trainer says the versions go through the tree" $?
    got="$(copies "k$k" | tr '\n' ' ')"
    [ "$got" = "0:$k.00 1:$k.00 2:$k.00 " ]; expect "fan-out $k: rank 0 serves $k copies of each version ($got)" $?
    n="$(relayed "k$k")"
    [ "$n" -eq $((3 * (4 - k))) ]; expect "fan-out $k: $((3 * (4 - k))) versions come from a relay ($n)" $?
    python3 - "$TMP/k$k/p/e/metrics.jsonl" "$TMP/ref/p/e/metrics.jsonl" "$k" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ref = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
k = int(sys.argv[3])
got = sum(r["perf/update_weights_bytes"] for r in rows)
want = sum(r["perf/update_weights_bytes"] for r in ref)
# the reference serves 4 copies of each version, the tree k: the bytes the metrics say are k/4 of the reference's
assert want > 0 and got * 4 == want * k, (got, want, k)
print(f"perf/update_weights_bytes: {got} in all, the reference's {want}")
PY
    expect "fan-out $k: the metrics' weight bytes are $k/4 of the reference's" $?
    s="$(grep -o "weight relay of rollout rank [0-9]*: [0-9]* bytes served" "$TMP/k$k.log" | grep -o "[0-9]* bytes" |
        awk '{s += $1} END {print s + 0}')"
    [ "$s" -gt 0 ]; expect "fan-out $k: the relays say what they served ($s bytes)" $?
    ! grep -q "weight relay failed rollout rank\|its digest is wrong\|no weight relay had room" "$TMP/k$k.log"
    expect "fan-out $k: no relay fails, nobody waits out the tree" $?
    identical "k$k"; st=$?; expect "fan-out $k: bit-identical to the reference ($(cat "$TMP/cmp-k$k.txt"))" "$st"
done

# every relay hostile: corrupt bytes (fan-out 2), or silent (fan-out 1)
for bad in corrupt silent; do
    k=$([ $bad = corrupt ] && echo 2 || echo 1)
    HOOK=$([ $bad = corrupt ] && echo GRPO_TEST_RELAY_CORRUPT_RANK || echo GRPO_TEST_RELAY_SILENT_RANK)
    run "$bad" -x "$HOOK=all" -- actor_rollout_ref.rollout.weight_relay_fanout=$k
    expect "$bad relays: the run finishes" $?
    f="$(grep -c "from rollout rank [0-9]*'s relay (.*): .*fetching it from the dispatcher" "$TMP/$bad.log")"
    [ "$f" -ge 1 ]; expect "$bad relays: receivers find them out and fetch from rank 0 ($f)" $?
    [ $bad = silent ] || [ "$(grep -c "its digest is wrong" "$TMP/$bad.log")" -eq "$f" ]
    expect "$bad relays: found out by the digest" $?
    n="$(grep -c "rollout rank [0-9]*'s weight relay failed" "$TMP/$bad.log")"
    [ "$n" -eq "$f" ]; expect "$bad relays: every failure reached the dispatcher ($n of $f)" $?
    never_again "$bad"; expect "$bad relays: a relay found bad is never named again (the dispatcher's log)" $?
    [ "$(relayed "$bad")" -eq 0 ]; expect "$bad relays: no version is taken from one" $?
    identical "$bad"; st=$?; expect "$bad relays: bit-identical to the reference ($(cat "$TMP/cmp-$bad.txt"))" "$st"
done

# one corrupt relay among good ones
run one-corrupt -x GRPO_TEST_RELAY_CORRUPT_RANK=0 -- actor_rollout_ref.rollout.weight_relay_fanout=1
expect "one corrupt relay: the run finishes" $?
[ "$(grep -c "chunk(s) from rollout rank 0's relay" "$TMP/one-corrupt.log")" -eq 0 ]
expect "one corrupt relay: nothing is taken from it" $?
[ "$(grep -c "rollout rank 0's weight relay failed .*it is never named a relay again" "$TMP/one-corrupt.log")" -le 1 ]
expect "one corrupt relay: barred at most once" $?
! grep "\[rank 0\] dispatch: " "$TMP/one-corrupt.log" | sed -n '/rollout rank 0.s weight relay failed/,$p' |
    grep -q "takes it from rollout rank 0's relay"
expect "one corrupt relay: never named after it was found out" $?
[ "$(relayed one-corrupt)" -ge 1 ]; st=$?; expect "one corrupt relay: the good relays serve ($(relayed one-corrupt))" "$st"
identical one-corrupt; st=$?; expect "one corrupt relay: bit-identical ($(cat "$TMP/cmp-one-corrupt.txt"))" "$st"

# one step off (rollout.mode=async): a version is fetched while the one before is still served, and some relays have
# moved on when asked ("not held": asked again, not named as failed)
run async-ref -- actor_rollout_ref.rollout.weight_relay_fanout=0 actor_rollout_ref.rollout.mode=async
expect "one step off, the tree off: finishes" $?
run async-k1 -- actor_rollout_ref.rollout.weight_relay_fanout=1 actor_rollout_ref.rollout.mode=async
expect "one step off, fan-out 1: finishes" $?
[ "$(relayed async-k1)" -ge 1 ]; st=$?; expect "one step off: versions come from relays ($(relayed async-k1))" "$st"
! grep -q "weight relay failed rollout rank\|its digest is wrong" "$TMP/async-k1.log"
expect "one step off: no relay is named as failed" $?
"$COMPARE" "$(weights async-ref)" "$(weights async-k1)" 0 >"$TMP/cmp-async.txt" 2>&1
st=$?; expect "one step off: bit-identical to the tree off ($(cat "$TMP/cmp-async.txt"))" "$st"

finish "$TMP"/*.log
