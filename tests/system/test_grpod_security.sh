#!/usr/bin/env bash
# Security and bad input: the ipc socket's file mode, a tcp endpoint that needs
# the shared secret (the secret file must be private: every reader, grpod, grpoctl,
# a worker and grpo-worker, refuses one group or others may read, one of mode 0700,
# another user's, and a secret under 128 bits, naming its size), proved by challenge-response
# (protocol 1.12: a wrong secret is found out, a request without a session and an
# older client's request carrying the secret itself are refused), an incompatible
# protocol version, and garbage, oversized and non-protocol bytes on both sockets,
# all while a worker keeps training.
set -u
. "$(dirname "$0")/grpod_lib.sh"
port=$(( 10000 + RANDOM % 20000 )) # below the ephemeral ports (32768-60999): no outgoing connection holds it
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

# every reader of a secret file applies grpod's checks (proto/transport.c secret_read; issue 39 item 6): each reader
# below reads FILE as its secret and must fail, naming what is wrong
read_with() { # read_with READER FILE: the reader's output
    case "$1" in
        grpod) timeout "$(scaled 10)" "$GRPOD" grpod.endpoint="$TCP" grpod.secret_file="$2" grpod.state_dir="$TMP/x" ;;
        grpoctl) timeout "$(scaled 10)" "$GRPOCTL" --endpoint "$TCP" --secret-file "$2" --retries 1 status ;;
        worker) timeout "$(scaled 10)" "$SIM" grpod.endpoint="$TCP" grpod.secret_file="$2" grpod.connect_timeout_s=2 --rank 0 \
            --world 1 --state "$TMP/reader.state" ;;
        grpo-worker) timeout "$(scaled 30)" "$WORKER" grpod.endpoint="$TCP" grpod.secret_file="$2" grpod.connect_timeout_s=2 ;;
    esac
}
refused_by_all() { # refused_by_all FILE TEXT WHAT
    local r
    for r in grpod grpoctl worker grpo-worker; do
        read_with "$r" "$1" >"$TMP/reader.out" 2>&1
        local rc=$?
        [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && has "$TMP/reader.out" "$2"
        st=$?; expect "$r refuses $3 (exit $rc: $(grep -o "secret[^;]*" "$TMP/reader.out" | head -1))" "$st"
    done
}
head -c 24 /dev/urandom | base64 >"$TMP/s644"; chmod 644 "$TMP/s644"
refused_by_all "$TMP/s644" "may be read by group or others (mode 0644); run: chmod 600" "a secret file of mode 0644"
head -c 24 /dev/urandom | base64 >"$TMP/s700"; chmod 700 "$TMP/s700"
refused_by_all "$TMP/s700" "has mode 0700: it must be 0600 or stricter" "a secret file of mode 0700"
printf 'abcdefghij\n' >"$TMP/short"; chmod 600 "$TMP/short"
refused_by_all "$TMP/short" "is 10 characters (60 bits at most, as base64); at least 22 are needed (128 bits" \
    "a secret of 10 characters, naming its size"
if [ "$(id -u)" -eq 0 ]; then
    head -c 24 /dev/urandom | base64 >"$TMP/theirs"; chmod 600 "$TMP/theirs"; chown 65534 "$TMP/theirs"
    refused_by_all "$TMP/theirs" "belongs to uid 65534, not to this process's user (uid 0)" "another user's secret file"
else
    echo "skip another user's secret file (needs root to make one)"
fi

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
has "$TMP/err" "authentication failed: grpod's proof does not match"; expect "wrong secret: authentication failed (grpod's proof)" $?
"$GRPOCTL" --endpoint "$TCP" status >"$TMP/err" 2>&1; [ $? -eq 2 ]; expect "grpoctl: tcp without a secret file is a usage error" $?
# a hand-made envelope (version 1, status_request) without a secret
nanocat --req --connect "$TCP" --data $'\x08\x01\x88\x01\x01' --ascii >"$TMP/auth.out" 2>&1 &
wait_for 10 has "$TMP/auth.out" "authentication failed"; expect "tcp request without a secret is refused" $?
kill $! 2>/dev/null
"$SIM" grpod.endpoint="$TCP" grpod.secret_file="$TMP/wrong" grpod.connect_timeout_s=3 --rank 0 --world 1 \
    --state "$TMP/intruder.state" >"$TMP/intruder.log" 2>&1
[ $? -eq 1 ]; expect "a worker with a wrong secret cannot register" $?
has "$TMP/intruder.log" "authentication failed"; expect "... and is told why" $?

# incompatible protocol version
nanocat --req --connect "$EP" --data $'\x08\x02\x88\x01\x01' --ascii >"$TMP/version.out" 2>&1 &
wait_for 10 has "$TMP/version.out" "incompatible protocol version 2: grpod speaks version 1"
expect "version 2 peer refused with a message" $?
kill $! 2>/dev/null

# garbage on both sockets
n=0
for ep in "$EP" "$TCP"; do
    for _ in 1 2 3; do
        n=$((n + 1))
        nanocat --req --connect "$ep" --data "$(head -c 200 /dev/urandom | tr -d '\0')" --ascii >"$TMP/garbage$n" 2>&1 &
        wait_for 10 test -s "$TMP/garbage$n"; r=$?
        kill $! 2>/dev/null
    done
    [ "$r" -eq 0 ] && has "$TMP/garbage$n" "malformed"; expect "garbage on $ep answered as malformed" $?
done
# non-protocol bytes straight into the tcp port, and a message over the size limit
head -c 65536 /dev/urandom >"/dev/tcp/127.0.0.1/$port" 2>/dev/null
printf 'GET / HTTP/1.0\r\n\r\n' >"/dev/tcp/127.0.0.1/$port" 2>/dev/null
head -c 2000000 /dev/zero | tr '\0' 'x' >"$TMP/big"
nanocat --req --connect "$EP" --file "$TMP/big" --ascii >"$TMP/big.out" 2>&1 &
BIG=$!
# the event after which an answer would be there: grpod has answered a request sent after the oversized one
nanocat --req --connect "$EP" --data "$(head -c 200 /dev/urandom | tr -d '\0')" --ascii >"$TMP/after" 2>&1 &
wait_for 10 test -s "$TMP/after"; expect "a request sent after the oversized one is answered" $?
kill $! "$BIG" 2>/dev/null
[ ! -s "$TMP/big.out" ]; expect "an oversized message gets no answer" $?
kill -0 "$GRPOD_PID"; expect "grpod still runs" $?
"$GRPOCTL" status >/dev/null; expect "grpod still answers" $?
"$GRPOCTL" --endpoint "$TCP" --secret-file "$TMP/secret" status >/dev/null; expect "grpod still answers on tcp" $?
state_is running; expect "the run goes on" $?
"$GRPOCTL" metrics >"$TMP/metrics"
grep -Eq 'grpod_rejected_requests_total\{reason="malformed"\} [1-9]' "$TMP/metrics"; expect "malformed requests counted" $?
grep -Eq 'grpod_rejected_requests_total\{reason="auth"\} [1-9]' "$TMP/metrics"; expect "auth failures counted" $?
grep -Eq 'grpod_rejected_requests_total\{reason="bad_version"\} [1-9]' "$TMP/metrics"; expect "version refusals counted" $?
# a client of protocol 1.11 or older sends the secret itself in every request: refused, whether right or not, and
# told to upgrade (the secret crossed the network: change it); grpod never takes the secret on the wire
# (a raw SP/TCP REQ client: the 8-byte SP header, then 8-byte big-endian length + request id + envelope)
sp_req() { # sp_req HOST PORT SECRET_HEX: prints the reply's bytes as text
    python3 - "$@" <<'PY'
import socket, struct, sys
host, port, secret = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
env = b"\x08\x01" + b"\x12" + bytes([len(secret)]) + secret + b"\x88\x01\x01"  # version 1, secret, status_request
s = socket.create_connection((host, port), timeout=3)
s.sendall(b"\x00SP\x00\x00\x30\x00\x00")  # REQ (48)
hdr = b""
while len(hdr) < 8:
    hdr += s.recv(8 - len(hdr))
body = struct.pack(">I", 0x80000001) + env
s.sendall(struct.pack(">Q", len(body)) + body)
data = b""
try:
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) >= 8 and len(data) >= 8 + struct.unpack(">Q", data[:8])[0]:
            break
except socket.timeout:
    pass
sys.stdout.write(data[12:].decode("latin-1"))
PY
}
sec_hex="$(head -n1 "$TMP/secret" | tr -d '\n' | od -An -tx1 | tr -d ' \n')"
sp_req 127.0.0.1 "$port" "$sec_hex" >"$TMP/out" 2>&1
has "$TMP/out" "sent the shared secret over the network" && ! has "$TMP/out" "run-"
expect "an older client's request with the right secret is refused, not answered with the status" $?
has "$TMP/out" "upgrade the client, and change the secret"; expect "... and it is told to upgrade and change the secret" $?
sp_req 127.0.0.1 "$port" "${sec_hex}006a756e6b" >"$TMP/out" 2>&1
has "$TMP/out" "authentication failed"; expect "the secret followed by NUL and junk is refused" $?
grep -q "refused a status_request request from a client of protocol 1\.[0-9]*: it sent the shared secret" "$TMP/g1.log"
expect "grpod logs the older client's request" $?
"$GRPOCTL" stop --wait="$(scaled 30)" >/dev/null; expect "stop" $?
stop_grpod

# what sits at the ipc socket path: only a stale socket is removed; anything else is refused, named, and kept
# (each grpod below must exit at once: one that serves instead is stopped by timeout, and the check fails)
echo precious >"$TMP/file.sock"
timeout "$(scaled 5)" "$GRPOD" grpod.endpoint="ipc://$TMP/file.sock" grpod.state_dir="$TMP/p1" grpod.http_listen= >"$TMP/err" 2>&1
rc=$?
[ "$rc" -eq 1 ]; expect "a regular file at the socket path: grpod exits 1 (got $rc)" $?
[ "$(cat "$TMP/file.sock" 2>/dev/null)" = precious ]; expect "... and the file is kept" $?
has "$TMP/err" "$TMP/file.sock exists and is a regular file, not a socket"; expect "... and the error names the path" $?
mkdir "$TMP/dir.sock"
timeout "$(scaled 5)" "$GRPOD" grpod.endpoint="ipc://$TMP/dir.sock" grpod.state_dir="$TMP/p2" grpod.http_listen= >"$TMP/err" 2>&1
rc=$?
[ "$rc" -eq 1 ]; expect "a directory at the socket path: grpod exits 1, no abort (got $rc)" $?
[ -d "$TMP/dir.sock" ] && has "$TMP/err" "$TMP/dir.sock exists and is a directory"; expect "... kept and named" $?
ln -s "$TMP/file.sock" "$TMP/link.sock"
timeout "$(scaled 5)" "$GRPOD" grpod.endpoint="ipc://$TMP/link.sock" grpod.state_dir="$TMP/p3" grpod.http_listen= >"$TMP/err" 2>&1
[ $? -eq 1 ] && [ -L "$TMP/link.sock" ] && has "$TMP/err" "is a symbolic link"; expect "a symbolic link is refused and kept" $?
python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$TMP/stale.sock"
[ -S "$TMP/stale.sock" ]; expect "a stale socket (nobody listens) is in place" $?
EP_SAVE="$EP"; EP="ipc://$TMP/stale.sock"; GRPOD_ENDPOINT="$EP"
start_grpod g2; expect "grpod replaces a stale socket and serves" $?
timeout "$(scaled 5)" "$GRPOD" grpod.endpoint="$EP" grpod.state_dir="$TMP/p4" grpod.http_listen= >"$TMP/err" 2>&1
rc=$?
[ "$rc" -eq 1 ] && has "$TMP/err" "is in use"; expect "a socket another grpod answers on is refused (exit $rc)" $?
"$GRPOCTL" --endpoint "$EP" status >/dev/null; expect "... and the first grpod still answers there" $?
stop_grpod
[ ! -e "$TMP/stale.sock" ]; expect "grpod removes its own socket at exit" $?
EP="$EP_SAVE"; GRPOD_ENDPOINT="$EP"
finish
