#!/usr/bin/env bash
# The cluster suite's link impairment (hosts_lib.sh's netem with NETEM_WITH=emulator: link_impair.c between two
# TAP devices on hostb's link), measured on three namespace hosts, whatever the kernel:
#  - bad arguments: exit 2 and a message naming the argument;
#  - 5% loss and 50 ms delay each way: 200 pings from hosta to hostb lose some (each has two 5% chances: about
#    10% expected, between 1% and 30% accepted) and none comes back in under 100 ms (2 x 50 ms); link_impair's
#    counters show each direction's own loss;
#  - 300 KB over TCP through it arrive whole (frames of the MTU, segmented and checksummed by the kernel);
#  - 500 numbered UDP datagrams 1 ms apart arrive in the order they were sent (as netem keeps it by default);
#  - netem_off: the link is back, pings come back fast and none is lost.
# usage: test_impair.sh (the build's link_impair by name, tests/lib.sh)
. "$(dirname "$0")/hosts_lib.sh" grpo-impair
LINK_IMPAIR="$(prog link-impair)"
hosts_up || finish
export NETEM_WITH=emulator

"$LINK_IMPAIR" x y loss 5 >"$TMP/bad.txt" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "loss '5'" "$TMP/bad.txt"; expect "loss without its % sign: exit 2 naming it ($rc)" $?
"$LINK_IMPAIR" x y delay 50 >"$TMP/bad.txt" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "delay '50'.*unit" "$TMP/bad.txt"; expect "delay without a unit: exit 2 naming it ($rc)" $?
"$LINK_IMPAIR" no-such-tap0 no-such-tap1 >"$TMP/bad.txt" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "no interface no-such-tap0" "$TMP/bad.txt"; expect "a missing TAP device is named ($rc)" $?

# ping_stats HOST ADDR COUNT: "LOSS_PERCENT MIN_MS AVG_MS" of COUNT pings from HOST (20 a second)
ping_stats() {
    on "$1" ping -q -n -c "$3" -i 0.05 -W 2 "$2" >"$TMP/ping.txt" 2>&1
    awk '/packet loss/ { for (i = 1; i <= NF; i++) if ($i ~ /%$/) { sub("%", "", $i); loss = $i } }
         /^rtt|^round-trip/ { split($4, r, "/"); mn = r[1]; av = r[2] }
         END { printf "%s %s %s\n", loss, (mn == "" ? "-1" : mn), (av == "" ? "-1" : av) }' "$TMP/ping.txt"
}
# in_range VALUE LO HI (decimals)
in_range() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v >= lo && v <= hi) }'; }

read -r loss0 _ avg0 < <(ping_stats hosta "$(ip_of hostb)" 20)
expect "undisturbed: 20 pings hosta -> hostb, $loss0% lost, rtt avg $avg0 ms" "$([ "$loss0" = 0 ] && echo 0 || echo 1)"

netem hostb loss 5% delay 50ms; expect "5% loss and 50 ms delay on hostb's link (link_impair)" $?
read -r loss min avg < <(ping_stats hosta "$(ip_of hostb)" 200)
in_range "$loss" 1 30; expect "200 pings through it: $loss% lost (about 10% expected: 5% each way)" $?
in_range "$min" 100 100000; expect "none back in under 2 x 50 ms (rtt min $min ms, avg $avg ms)" $?
in_range "$avg" 100 400; expect "rtt avg $avg ms: 100 ms and what a loaded machine adds" $?

# 300 KB over TCP, hosta -> hostb, checked whole
head -c 300000 /dev/urandom >"$TMP/blob"
on hostb python3 -c '
import hashlib, socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 9100)); s.listen(1)
open(sys.argv[1], "w").write("listening\n")
c, _ = s.accept(); h = hashlib.sha256(); n = 0
while True:
    b = c.recv(65536)
    if not b: break
    h.update(b); n += len(b)
open(sys.argv[1], "a").write("%d %s\n" % (n, h.hexdigest()))' "$TMP/recv.txt" &
track $!
wait_alive 20 $! has "$TMP/recv.txt" listening; rc=$?
expect "a TCP receiver on hostb" $rc; [ $rc = 0 ] || finish
t0=$(date +%s)
timeout "$(scaled 120)" "$TMP/on.sh" hosta python3 -c '
import socket, sys
s = socket.create_connection((sys.argv[1], 9100)); s.sendall(open(sys.argv[2], "rb").read()); s.close()' \
    "$(ip_of hostb)" "$TMP/blob"
rc=$?
expect "300 KB sent hosta -> hostb through it ($(($(date +%s) - t0)) s)" $rc
want_line="300000 $(sha256sum "$TMP/blob" | cut -d' ' -f1)"
wait_for 30 grep -qx "$want_line" "$TMP/recv.txt"; expect "they arrive whole (sha256)" $?

# 500 numbered datagrams, hosta -> hostb, 1 ms apart: held 50 ms each, they arrive in the order they were sent
on hostb python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 9101)); s.settimeout(3)
open(sys.argv[1], "w").write("listening\n"); got = []
try:
    while True: got.append(int(s.recv(64)))
except socket.timeout: pass
open(sys.argv[1], "a").write("%d %d\n" % (len(got), sum(1 for a, b in zip(got, got[1:]) if b < a)))' "$TMP/udp.txt" &
track $!
wait_alive 20 $! has "$TMP/udp.txt" listening; rc=$?
expect "a UDP receiver on hostb" $rc; [ $rc = 0 ] || finish
on hosta python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(500): s.sendto(b"%d" % i, (sys.argv[1], 9101)); time.sleep(0.001)' "$(ip_of hostb)" # sleep-ok: pacing the packets
wait_for 60 awk 'NR == 2 { exit 0 } END { exit NR < 2 }' "$TMP/udp.txt"
read -r got back < <(sed -n 2p "$TMP/udp.txt")
[ "${got:-0}" -ge 400 ] && [ "${back:-1}" = 0 ]
expect "500 datagrams: ${got:-?} arrive (5% lost), ${back:-?} of them before one sent earlier (0 wanted)" $?

netem_off hostb
cat "$TMP/impair-hostb.log"
# each direction's own loss: the counters link_impair prints on its way out
awk '/ -> .* lost/ { f += $5; l += $7 } END { if (f < 500) exit 1; p = 100 * l / f; printf "%.2f\n", p; exit !(p >= 2 && p <= 10) }' \
    "$TMP/impair-hostb.log" >"$TMP/pct.txt"
rc=$?
expect "link_impair's counters: $(cat "$TMP/pct.txt")% of the frames lost, both ways (5% asked)" $rc
read -r loss1 _ avg1 < <(ping_stats hosta "$(ip_of hostb)" 20)
[ "$loss1" = 0 ] && in_range "$avg1" 0 50
expect "netem_off: the link is back (20 pings, $loss1% lost, rtt avg $avg1 ms)" $?
finish
