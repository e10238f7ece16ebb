#!/usr/bin/env bash
# bench/sim_ranks speaks the real protocol (issue 45 item 4): 24 simulated rollout ranks in two processes and a
# simulated trainer rank 0 running the real dispatcher register with a real grpod (grpod's own status lists all 25),
# heartbeat, and go through 3 steps: every unit of every step granted once and delivered, every version fetched
# whole by every rollout rank (the dispatcher's bytes out: 24 copies a version), no error, no refusal.
set -u
. "$(dirname "$0")/grpod_lib.sh"
SIMR="$(prog sim-ranks)"
R=24 W=25 FLOATS=1000
start_grpod g placement.trainer_ranks=1 placement.rollout_ranks=$R data.train_batch_size=$R \
    actor_rollout_ref.actor.ppo_mini_batch_size=$R grpod.data_endpoint="ipc://$TMP/data" \
    grpod.heartbeat_interval_s=1 grpod.heartbeat_timeout_s=10 # the real interval: the sims heartbeat at 1 s
expect "grpod runs" $?

"$SIMR" --endpoint "$EP" --world $W --trainer --units $R --steps 3 --floats $FLOATS --interval 1 \
    --seconds "$(scaled 60)" --launch 5e1 >"$TMP/trainer.out" 2>"$TMP/trainer.err" &
T=$!
track "$T"
"$SIMR" --endpoint "$EP" --world $W --first 1 --count 12 --rollout --units $R --interval 1 \
    --seconds "$(scaled 60)" --launch 5e1 >"$TMP/a.out" 2>"$TMP/a.err" &
A=$!
track "$A"
"$SIMR" --endpoint "$EP" --world $W --first 13 --count 12 --rollout --units $R --interval 1 \
    --seconds "$(scaled 60)" --launch 5e1 >"$TMP/b.out" 2>"$TMP/b.err" &
B=$!
track "$B"

wait_for 20 field_is '.workers_registered' $W; expect "grpod's status lists the $W simulated ranks" $?
wait_for 20 field_is '[.workers[] | select(.state == "running")] | length' $W
expect "every one heartbeats (running)" $?
wait "$T"; expect "the trainer ends 0 after its 3 steps" $?
wait "$A"; expect "rollout process a ends 0 (it heard the end)" $?
wait "$B"; expect "rollout process b ends 0" $?

kv() { sed -n 's/.* '"$2"'=\([^ ]*\).*/\1/p' "$1" | tail -n 1; }
[ "$(kv "$TMP/trainer.out" granted)" = 72 ] && [ "$(kv "$TMP/trainer.out" regranted)" = 0 ] &&
    [ "$(kv "$TMP/trainer.out" refused)" = 0 ]
st=$?; expect "the dispatcher granted 3 x $R units, none twice, refused nothing ($(kv "$TMP/trainer.out" granted))" "$st"
[ "$(kv "$TMP/trainer.out" weight_bytes_per_version)" = $((R * FLOATS * 4)) ]
st=$?; expect "each version went out $R times whole ($(kv "$TMP/trainer.out" weight_bytes_per_version) bytes)" "$st"
[ $(( $(kv "$TMP/a.out" grants) + $(kv "$TMP/b.out" grants) )) = 72 ] &&
    [ "$(kv "$TMP/a.out" registered)" = 12 ] && [ "$(kv "$TMP/b.out" registered)" = 12 ] &&
    [ "$(kv "$TMP/a.out" errors)" = 0 ] && [ "$(kv "$TMP/b.out" errors)" = 0 ]
expect "the rollout ranks registered, were granted the 72 units and saw no error" $?
[ $(( $(kv "$TMP/a.out" weight_bytes) + $(kv "$TMP/b.out" weight_bytes) )) = $((3 * R * FLOATS * 4)) ]
expect "and fetched every version's bytes" $?

# a bad command line is refused with what was wrong, not run
"$SIMR" --endpoint "$EP" --world 4 --first 3 --count 2 >/dev/null 2>"$TMP/bad.err"
[ $? = 2 ] && grep -q 'within the world' "$TMP/bad.err"; expect "ranks outside the world: exit 2, named" $?
finish "$TMP/trainer.err" "$TMP/a.err" "$TMP/b.err" "$TMP/g.log"
