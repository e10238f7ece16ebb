#!/usr/bin/env bash
# Security and bad input: the ipc socket's file mode, a tcp endpoint that needs
# the shared secret (the secret file must be private), refused requests without
# or with a wrong secret, an incompatible protocol version, and garbage, oversized
# and non-protocol bytes on both sockets, all while a worker keeps training.
set -u
. "$(dirname "$0")/grpod_lib.sh" "$@"
port=$(( 20000 + RANDOM % 20000 ))
TCP="tcp://127.0.0.1:$port"
head -c 24 /dev/urandom | base64 >"$TMP/secret"
chmod 644 "$TMP/secret"

"$GRPOD" grpod.endpoint="$TCP" grpod.secret_file="$TMP/secret" grpod.state_dir="$TMP/x" >"$TMP/err" 2>&1
[ $? -eq 2 ]; expect "grpod refuses a group/world-readable secret file (exit 2)" $?
has "$TMP/err" "may be read by group or others (mode 0644); run: chmod 600"; expect "refusal says how to fix it" $?
chmod 600 "$TMP/secret"
: >"$TMP/empty"; chmod 600 "$TMP/empty"
"$GRPOD" grpod.endpoint="$TCP" grpod.secret_file="$TMP/empty" grpod.state_dir="$TMP/x" >"$TMP/err" 2>&1
[ $? -eq 2 ]; expect "grpod refuses an empty secret file" $?

start_grpod g1 grpod.endpoint="$EP,$TCP" grpod.secret_file="$TMP/secret" grpod.socket_mode=0600
expect "grpod serves ipc and tcp" $?
[ "$(stat -c %a "$TMP/ctl.sock")" = 600 ]; expect "ipc socket has the configured mode 0600" $?
if [ "$(id -u)" -eq 0 ] && command -v runuser >/dev/null && chmod 755 "$TMP" && runuser -u nobody -- true 2>/dev/null; then
    runuser -u nobody -- "$GRPOCTL" --retries 1 status >"$TMP/err" 2>&1
    [ $? -eq 3 ]; expect "another user cannot connect to the ipc socket" $?
    has "$TMP/err" "permission denied"; expect "... and is told why" $?
else
    echo "skip other-user check (needs root and runuser)"
fi
start_sim w0 0 1 --steps 100000 --step-ms 30 --host hostA
wait_for 15 state_is running; expect "worker runs (ipc)" $?

"$GRPOCTL" --endpoint "$TCP" --secret-file "$TMP/secret" status >/dev/null; expect "tcp with the secret works" $?
head -c 24 /dev/urandom | base64 >"$TMP/wrong"; chmod 600 "$TMP/wrong"
"$GRPOCTL" --endpoint "$TCP" --secret-file "$TMP/wrong" status >"$TMP/err" 2>&1
[ $? -eq 1 ]; expect "tcp with a wrong secret: exit 1" $?
has "$TMP/err" "authentication failed"; expect "wrong secret: authentication failed" $?
"$GRPOCTL" --endpoint "$TCP" status >"$TMP/err" 2>&1; [ $? -eq 2 ]; expect "grpoctl: tcp without a secret file is a usage error" $?
# a hand-made envelope (version 1, status_request) without a secret
nanocat --req --connect "$TCP" --data $'\x08\x01\x88\x01\x01' --ascii >"$TMP/out" 2>&1 &
sleep 1; kill $! 2>/dev/null
has "$TMP/out" "authentication failed"; expect "tcp request without a secret is refused" $?
"$SIM" grpod.endpoint="$TCP" grpod.secret_file="$TMP/wrong" grpod.connect_timeout_s=3 --rank 0 --world 1 \
    --state "$TMP/intruder.state" >"$TMP/intruder.log" 2>&1
[ $? -eq 1 ]; expect "a worker with a wrong secret cannot register" $?
has "$TMP/intruder.log" "authentication failed"; expect "... and is told why" $?

# incompatible protocol version
nanocat --req --connect "$EP" --data $'\x08\x02\x88\x01\x01' --ascii >"$TMP/out" 2>&1 &
sleep 1; kill $! 2>/dev/null
has "$TMP/out" "incompatible protocol version 2: grpod speaks version 1"; expect "version 2 peer refused with a message" $?

# garbage on both sockets
for ep in "$EP" "$TCP"; do
    for i in 1 2 3; do
        nanocat --req --connect "$ep" --data "$(head -c 200 /dev/urandom | tr -d '\0')" --ascii >"$TMP/out" 2>&1 &
        sleep 0.3; kill $! 2>/dev/null
    done
    has "$TMP/out" "malformed"; expect "garbage on $ep answered as malformed" $?
done
# non-protocol bytes straight into the tcp port, and a message over the size limit
head -c 65536 /dev/urandom >"/dev/tcp/127.0.0.1/$port" 2>/dev/null
printf 'GET / HTTP/1.0\r\n\r\n' >"/dev/tcp/127.0.0.1/$port" 2>/dev/null
head -c 2000000 /dev/zero | tr '\0' 'x' >"$TMP/big"
nanocat --req --connect "$EP" --file "$TMP/big" --ascii >"$TMP/out" 2>&1 &
sleep 1; kill $! 2>/dev/null
[ ! -s "$TMP/out" ]; expect "an oversized message gets no answer" $?
kill -0 "$GRPOD_PID"; expect "grpod still runs" $?
"$GRPOCTL" status >/dev/null; expect "grpod still answers" $?
"$GRPOCTL" --endpoint "$TCP" --secret-file "$TMP/secret" status >/dev/null; expect "grpod still answers on tcp" $?
state_is running; expect "the run goes on" $?
"$GRPOCTL" metrics >"$TMP/metrics"
grep -Eq 'grpod_rejected_requests_total\{reason="malformed"\} [1-9]' "$TMP/metrics"; expect "malformed requests counted" $?
grep -Eq 'grpod_rejected_requests_total\{reason="auth"\} [1-9]' "$TMP/metrics"; expect "auth failures counted" $?
grep -Eq 'grpod_rejected_requests_total\{reason="bad_version"\} [1-9]' "$TMP/metrics"; expect "version refusals counted" $?
"$GRPOCTL" stop --wait=30 >/dev/null; expect "stop" $?
echo "$fails failure(s)"
[ "$fails" -eq 0 ]
