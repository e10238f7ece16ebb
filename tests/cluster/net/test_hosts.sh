#!/usr/bin/env bash
# The namespace hosts themselves (hosts_lib.sh), in seconds, wherever the checkout is:
#  - a checkout under /tmp (a directory /tmp/grpo-clone.XXXXXX with the build's grpoctl copied in and a script and
#    a file of its own): every host starts its programs (by absolute path, and relative to a working directory
#    there) and reads its file, although each host's /tmp is its own (a file one host writes there, no other host
#    and not the machine sees); before, the hosts' /tmp hid it ("No such file or directory") and cluster-net and
#    cluster-net-impair waited to their bounds;
#  - a host that cannot start a program: hosts_up FAILs within seconds naming the host and the program, `on` exits
#    127 at once naming it, and grpod_up is over at once when grpod ends at start (its log's tail shown);
#  - what a killed run left: a run SIGKILLed after hosts_up (as meson ends a test past its time) leaves its
#    namespaces, /etc/netns entries, bridge and veths; while it lives, another run's hosts_up leaves them alone;
#    once it is gone, the next hosts_up (hosts_sweep) clears them, its record and its $TMP. Names from before the
#    owner records (gnPID-HOST, gnbrPID) whose PID is gone are cleared too.
# usage: test_hosts.sh (the build's grpoctl by name, tests/lib.sh)
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/hosts_lib.sh" grpo-hosts
GRPOCTL_BUILT="$(prog grpoctl)"
CLONE="$(mktemp -d /tmp/grpo-clone.XXXXXX)" || { echo "FAIL cannot make a directory under /tmp"; exit 1; }
CHILDREN=()
# at exit: this run's hosts; the child runs killed and what they left cleared (hosts_sweep: their owners are gone)
trap 'lib_cleanup; hosts_down; for c in "${CHILDREN[@]}"; do kill -9 "$c" 2>/dev/null; done
    hosts_sweep >/dev/null; rm -rf "$CLONE"' EXIT

# ---- the "checkout" under /tmp
mkdir -p "$CLONE/build" "$CLONE/src"
cp "$GRPOCTL_BUILT" "$CLONE/build/grpoctl"
printf '#!/bin/sh\necho "hello from $(hostname)"\n' >"$CLONE/src/hello.sh"
printf '#!/bin/sh\necho "grpod: cannot listen (planted)"\nexit 1\n' >"$CLONE/src/fails.sh"
chmod +x "$CLONE/src/hello.sh" "$CLONE/src/fails.sh"
echo "the checkout's data" >"$CLONE/src/data.txt"

# child.sh SIGNAL_FILE [PROGRAM...]: another run of hosts_lib.sh (its own process, its own names): hosts_up with
# PROGRAM... to start, then "up" in SIGNAL_FILE and it stays (exec: the same process, its cleanup never run)
cat >"$TMP/child.sh" <<EOF
#!/usr/bin/env bash
. "$here/hosts_lib.sh" grpo-hosts-child
echo "run \$RUN_ID"
HOST_PROGRAMS=("\${@:2}")
hosts_up || finish
echo up >"\$1"
exec sleep 600 # sleep-ok: a stand-in process that must stay alive
EOF
chmod +x "$TMP/child.sh"
# gone ID: nothing of run ID is left: namespaces, /etc/netns entries, links, mounts, its record and stage
gone() {
    ! ip netns list | grep -q "^gn$1-" && ! ls -d /etc/netns/gn"$1"-* >/dev/null 2>&1 &&
        ! ip -o link show | grep -Eq ": (gnbr$1|gv$1[0-2])[:@]" && ! grep -q "gn$1-\|/$1\.stage" /proc/self/mounts &&
        [ ! -e "$OWNERS/$1" ] && [ ! -e "$OWNERS/$1.stage" ]
}
# all_there ID: run ID's three hosts and its bridge are there
all_there() {
    [ "$(ip netns list | grep -c "^gn$1-host[abc] ")" = 3 ] && ip link show "gnbr$1" >/dev/null 2>&1
}

# ---- a live run (A), and what a run of the code before the owner records left (its pid D gone)
bash "$TMP/child.sh" "$TMP/a.up" >"$TMP/a.log" 2>&1 &
A=$!
CHILDREN+=("$A")
wait_alive 30 "$A" test -s "$TMP/a.up"; rc=$?
if [ $rc = 2 ]; then
    wait "$A"
    [ $? = 77 ] && skip "$(sed -n "s/^SKIP //p" "$TMP/a.log")" # not root, or no namespaces here
fi
expect "another run (pid $A) has its hosts up" $rc
D="$(bash -c 'echo $$')"
while kill -0 "$D" 2>/dev/null || ip netns list | grep -q "^gn$D-"; do D=$((D + 1)); done
ip netns add "gn$D-hosta" && mkdir -p "/etc/netns/gn$D-hosta" && echo "127.0.0.1 localhost" >"/etc/netns/gn$D-hosta/hosts" &&
    ip link add "gnbr$D" type bridge && ip link add "gv${D}0" type veth peer name eth0 netns "gn$D-hosta"
expect "a leftover of a gone run (pid $D) before the owner records: namespace, /etc/netns, bridge, veth" $?

# ---- this run's hosts, with the programs of the checkout under /tmp
# shellcheck disable=SC2034 # (hosts_lib.sh's)
HOST_PROGRAMS=("$CLONE/build/grpoctl" "$CLONE/src/hello.sh") HOST_FILES=("$CLONE/src/data.txt")
hosts_up >"$TMP/up.out" 2>&1; rc=$?
cat "$TMP/up.out"
expect "hosts up (the checkout at $CLONE)" $rc
[ $rc = 0 ] || finish
all_there "$A" && [ -f "$OWNERS/$A" ] && ip netns exec "gn$A-hostb" ip -o addr show dev eth0 | grep -q "inet 10\.77\."
expect "the live run's hosts, bridge and record are left alone" $?
gone "$D"; expect "the gone run's namespace, /etc/netns entry, bridge and veth are cleared" $?
has "$TMP/up.out" "clearing what run $D left"; expect "hosts_up says what it clears" $?

ok=0
for h in hosta hostb hostc; do
    on "$h" "$CLONE/build/grpoctl" --help >"$TMP/help-$h.txt" 2>&1 && has "$TMP/help-$h.txt" "grpoctl" || ok=1
    [ "$(on "$h" "$CLONE/src/hello.sh" 2>&1)" = "hello from $h" ] || ok=1
    [ "$(cd "$CLONE/src" && on "$h" ./hello.sh 2>&1)" = "hello from $h" ] || ok=1
    [ "$(on "$h" cat "$CLONE/src/data.txt" 2>&1)" = "the checkout's data" ] || ok=1
    on "$h" test -w "$TMP" || ok=1
done
expect "each host starts the checkout's programs (by path, and relative to a directory there) and reads its file" $ok
mine="/tmp/grpo-hosts-own.$RUN_ID"
on hosta sh -c "echo a >$mine" && on hosta test -f "$mine" && ! on hostb test -e "$mine" && [ ! -e "$mine" ]
expect "each host's /tmp is still its own (a file hosta writes there: not on hostb, not on the machine)" $?

# ---- a host that cannot start a program: at once, named
t0=$(date +%s%N)
on hosta "$CLONE/build/no-such-program" >"$TMP/on-missing.txt" 2>&1; rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc = 127 ] && has "$TMP/on-missing.txt" "on hosta: cannot start $CLONE/build/no-such-program: no such file or directory"
chk=$?; expect "on: a missing program: exit $rc in $ms ms, named ($(head -c 200 "$TMP/on-missing.txt"))" $chk
t0=$(date +%s)
timeout "$(scaled 60)" bash "$TMP/child.sh" "$TMP/b.up" "$CLONE/build/no-such-program" >"$TMP/b.log" 2>&1; rc=$?
s=$(($(date +%s) - t0))
[ $rc = 1 ] && [ $s -le 15 ] && [ ! -e "$TMP/b.up" ] &&
    has "$TMP/b.log" "FAIL hosta cannot start or read $CLONE/build/no-such-program: no such file or directory"
expect "hosts_up with a program the hosts cannot start: FAIL in $s s (exit $rc), naming host and program" $?
b_id="$(sed -n 's/^run \([0-9]*\)$/\1/p' "$TMP/b.log")"
[ -n "$b_id" ] && gone "$b_id"; expect "the failed run ($b_id) cleared its hosts at exit" $?
# shellcheck disable=SC2034 # (grpod_up's)
GRPOD="$CLONE/src/fails.sh" GRPOCTL="$CLONE/build/grpoctl"
t0=$(date +%s)
grpod_up hostc >"$TMP/grpod-up.out" 2>&1; rc=$?
s=$(($(date +%s) - t0))
[ $rc != 0 ] && [ $s -le 5 ] && has "$TMP/grpod-up.out" "it ended" && has "$TMP/grpod-up.out" "cannot listen (planted)"
expect "grpod_up: a grpod that ends at start is told in $s s (not 20), with its log" $?

# ---- the live run killed (SIGKILL: no cleanup of its own), then cleared by the next sweep
kill -9 "$A"
wait "$A" 2>/dev/null
a_tmp="$(awk '{ print $4 }' "$OWNERS/$A" 2>/dev/null)"
all_there "$A" && [ -d "$a_tmp" ]; expect "killed, run $A left its hosts, bridge and \$TMP ($a_tmp)" $?
hosts_sweep >"$TMP/sweep.out" 2>&1
cat "$TMP/sweep.out"
gone "$A" && [ ! -e "$a_tmp" ]; expect "the sweep cleared them all, its record and its \$TMP" $?
has "$TMP/sweep.out" "clearing what run $A left (its owner, pid $A, is gone)"; expect "and said so" $?
all_there "$RUN_ID" && on hosta true; expect "this run's own hosts are untouched" $?
finish
