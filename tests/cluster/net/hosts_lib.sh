# shellcheck shell=bash
# The cluster suite's layer over tests/lib.sh: three "hosts" made of Linux network namespaces, Open MPI across them
# and grpod on TCP with its secret.
# usage: . hosts_lib.sh PREFIX   (then hosts_up)
# It gives, besides lib.sh's:
#   hosts_up            three hosts hosta, hostb, hostc: a bridge in the root namespace, a veth each with its own
#                       address ($NET.1-3/24), its own UTS name, an /etc/hosts naming all three
#                       (/etc/netns/NS/hosts, which `ip netns exec` mounts), and a private /tmp (a tmpfs in a mount
#                       namespace of its own, with $TMP mounted back at its path: the "shared file system"). Torn
#                       down at exit, also on a failure. Exit 77 when not root or when namespaces cannot be made.
#   on HOST CMD...      CMD on HOST (its network, name and /tmp)
#   ip_of HOST          HOST's address; VETH_hostb etc. are the root-namespace ends of the hosts' links
#   link_down HOST, link_up HOST        the host's link (its root-namespace end)
#   netem HOST loss P% delay Dms        packet loss and delay on HOST's link, both ways (each frame that leaves
#                       HOST and each that reaches it: a ping's round trip is delayed 2 x D and lost with
#                       probability 1-(1-P)^2): the kernel's netem qdisc on both ends of the link where the kernel
#                       has it (`tc qdisc replace ... netem ARGS`), else $LINK_IMPAIR (link_impair.c) on the link's
#                       path: the host's root-namespace veth end moves from the bridge to a bridge of its own with a
#                       TAP device, link_impair forwards every frame between that TAP and a second one on the main
#                       bridge, dropping and delaying it. NETEM_WITH=tc|emulator forces one (default: auto). It says
#                       which in the test's output; netem_off HOST undoes it (link_impair's counters in
#                       $TMP/impair-HOST.log)
#   partition A B, heal A B             drop traffic between hosts A and B (both ways: prohibit routes in each)
#   $MPIRUN_NET         mpirun options that start remote ranks through $TMP/rsh.sh (which enters the host), on TCP
#                       over the bridge's network
#   grpod_up HOST [key=value...]        grpod on HOST on tcp://ADDR:7070 (7071, ... for the next ones) with a secret ($SECRET): $EP, GRPOD_PID,
#                       log $TMP/grpod.log; exported GRPOD_ENDPOINT/GRPOD_SECRET_FILE for grpoctl
. "$(dirname "${BASH_SOURCE[0]}")/../../lib.sh" "$1"
test_env

# names short enough for interface names (15 characters): one set per test process
NET_ID=$(($$ % 200 + 20))
NS_PREFIX="gn$$"
BRIDGE="gnbr$$"
STAGE="/run/grpo-net-$$" # where on.sh holds $TMP while it covers /tmp
NET="10.77.$NET_ID"
HOSTS=(hosta hostb hostc)
NET_UP=0

hosts_down() {
    [ "$NET_UP" = 1 ] || return 0
    local i h
    for i in 0 1 2; do
        h=${HOSTS[$i]}
        ip netns pids "$NS_PREFIX-$h" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip link del "gv$$$i" 2>/dev/null
        ip link del "gta$$$i" 2>/dev/null; ip link del "gtb$$$i" 2>/dev/null; ip link del "gnx$$$i" 2>/dev/null
        ip netns del "$NS_PREFIX-$h" 2>/dev/null
        rm -rf "/etc/netns/$NS_PREFIX-$h"
    done
    rmdir "$STAGE" 2>/dev/null
    ip link del "$BRIDGE" 2>/dev/null
    NET_UP=0
}
trap 'lib_cleanup; hosts_down' EXIT

skip() { echo "SKIP $*"; exit 77; }

hosts_up() {
    [ "$(id -u)" = 0 ] || skip "the cluster suite makes network namespaces: it needs root"
    command -v ip >/dev/null && command -v unshare >/dev/null && command -v tc >/dev/null ||
        skip "the cluster suite needs ip, tc (iproute2) and unshare (util-linux)"
    ip netns add "$NS_PREFIX-probe" 2>"$TMP/netns.err" || skip "cannot make a network namespace: $(cat "$TMP/netns.err")"
    ip netns del "$NS_PREFIX-probe"
    NET_UP=1
    ip link add "$BRIDGE" type bridge && ip link set "$BRIDGE" up || skip "cannot make a bridge"
    mkdir -p "$STAGE"
    local i h hosts_file="$TMP/hosts"
    printf '127.0.0.1 localhost\n' >"$hosts_file"
    for i in 0 1 2; do printf '%s.%d %s\n' "$NET" $((i + 1)) "${HOSTS[$i]}" >>"$hosts_file"; done
    for i in 0 1 2; do
        h=${HOSTS[$i]}
        ip netns add "$NS_PREFIX-$h" || return 1
        mkdir -p "/etc/netns/$NS_PREFIX-$h" "$TMP/hosts.d/$h"
        cp "$hosts_file" "/etc/netns/$NS_PREFIX-$h/hosts"
        ip link add "gv$$$i" type veth peer name eth0 netns "$NS_PREFIX-$h" || return 1
        ip link set "gv$$$i" master "$BRIDGE" up
        printf -v "VETH_$h" '%s' "gv$$$i"
        ip -n "$NS_PREFIX-$h" addr add "$NET.$((i + 1))/24" dev eth0
        ip -n "$NS_PREFIX-$h" link set eth0 up
        ip -n "$NS_PREFIX-$h" link set lo up
    done
    # the remote shell Open MPI starts its daemons with: "rsh.sh HOST COMMAND..." runs COMMAND on HOST
    cat >"$TMP/rsh.sh" <<EOF
#!/usr/bin/env bash
h="\$1"; shift
while [ "\${h#-}" != "\$h" ]; do h="\$1"; shift; done
exec "$TMP/on.sh" "\$h" /bin/sh -c "\$*"
EOF
    # on.sh HOST CMD...: CMD in HOST's network namespace, with its own name and /tmp ($TMP mounted back)
    cat >"$TMP/on.sh" <<EOF
#!/usr/bin/env bash
h="\$1"; shift
exec ip netns exec "$NS_PREFIX-\$h" unshare --uts --mount --propagation private -- /bin/bash -c '
    set -e; h="\$1"; shift; hostname "\$h"
    mount --bind "$TMP" "$STAGE"; mount --bind "$TMP/hosts.d/\$h" /tmp; mkdir -p "$TMP"; mount --move "$STAGE" "$TMP"
    exec "\$@"' on "\$h" "\$@"
EOF
    chmod +x "$TMP/rsh.sh" "$TMP/on.sh"
    on hostb true || skip "cannot enter a namespace host (ip netns exec + unshare)"
    on hosta bash -c 'exec 3<>/dev/tcp/hostb/9' 2>&1 | grep -q refused || { echo "FAIL hosta cannot reach hostb"; return 1; }
    MPIRUN_NET=(mpirun --oversubscribe --bind-to none --mca plm_rsh_agent "$TMP/rsh.sh"
        --mca oob_tcp_if_include "$NET.0/24" --mca btl_tcp_if_include "$NET.0/24" --mca btl self,vader,tcp
        -x OPENBLAS_NUM_THREADS -x OMP_NUM_THREADS -x GRPO_COMM_SYNC_SENDS=1)
}

on() { "$TMP/on.sh" "$@"; }
ip_of() { local i; for i in 0 1 2; do [ "${HOSTS[$i]}" = "$1" ] && echo "$NET.$((i + 1))"; done; }
veth_of() { local v="VETH_$1"; echo "${!v}"; }
link_down() { ip link set "$(veth_of "$1")" down; }
link_up() { ip link set "$(veth_of "$1")" up; }
netem() {
    local h="$1"; shift
    local with="${NETEM_WITH:-auto}"
    if [ "$with" = auto ]; then if netem_available; then with=tc; else with=emulator; fi; fi
    case "$with" in
    tc)
        echo "     netem $h: the kernel's netem qdisc on both ends of $h's link: $*"
        tc qdisc replace dev "$(veth_of "$h")" root netem "$@" &&
            ip netns exec "$NS_PREFIX-$h" tc qdisc replace dev eth0 root netem "$@"
        ;;
    emulator)
        echo "     netem $h: no netem qdisc in this kernel: link_impair (user space, TAP devices) on $h's link: $*"
        impair_on "$h" "$@"
        ;;
    *) echo "NETEM_WITH=$with: want auto, tc or emulator"; return 1 ;;
    esac
}
# netem_available: this kernel has the netem qdisc (sch_netem); some container kernels lack it
netem_available() {
    local ok=1
    ip link add "gnq$$" type veth peer name "gnr$$" 2>/dev/null || return 1
    tc qdisc add dev "gnq$$" root netem delay 1ms 2>/dev/null && ok=0
    ip link del "gnq$$" 2>/dev/null
    return $ok
}
# host_index HOST: 0, 1 or 2
host_index() { local i; for i in 0 1 2; do [ "${HOSTS[$i]}" = "$1" ] && echo $i; done; }
# impair_on HOST ARGS...: link_impair on HOST's link. Path of a frame from HOST: eth0 -> veth -> its root end on
# bridge gnx$$I -> TAP gta$$I -> link_impair (drop or hold) -> TAP gtb$$I on the main bridge -> the other hosts;
# the reverse path the same way back. A TAP device without offloads gets whole segmented, checksummed frames.
impair_on() {
    local h="$1" i; shift
    i=$(host_index "$h")
    [ -x "${LINK_IMPAIR:-}" ] || { echo "link_impair is not built (LINK_IMPAIR=${LINK_IMPAIR:-})"; return 1; }
    ip link add "gnx$$$i" type bridge && ip link set "gnx$$$i" up &&
        ip tuntap add dev "gta$$$i" mode tap && ip tuntap add dev "gtb$$$i" mode tap &&
        ip link set "gta$$$i" master "gnx$$$i" up && ip link set "gtb$$$i" master "$BRIDGE" up || return 1
    "$LINK_IMPAIR" "gta$$$i" "gtb$$$i" "$@" >"$TMP/impair-$h.log" 2>&1 &
    printf -v "IMPAIR_PID_$h" '%s' $!
    track $!
    wait_for 10 has "$TMP/impair-$h.log" "link_impair: forwarding" ||
        { echo "link_impair did not start: $(cat "$TMP/impair-$h.log")"; return 1; }
    # only now, with the way through ready, the host's link leaves the main bridge
    ip link set "$(veth_of "$h")" nomaster && ip link set "$(veth_of "$h")" master "gnx$$$i"
}
impair_off() {
    local h="$1" i p
    i=$(host_index "$h")
    p="IMPAIR_PID_$h"
    [ -n "${!p:-}" ] || return 0
    ip link set "$(veth_of "$h")" nomaster 2>/dev/null
    ip link set "$(veth_of "$h")" master "$BRIDGE" 2>/dev/null
    kill -TERM "${!p}" 2>/dev/null
    wait "${!p}" 2>/dev/null
    printf -v "$p" '%s' ""
    ip link del "gta$$$i" 2>/dev/null
    ip link del "gtb$$$i" 2>/dev/null
    ip link del "gnx$$$i" 2>/dev/null
    return 0
}
netem_off() {
    impair_off "$1"
    tc qdisc del dev "$(veth_of "$1")" root 2>/dev/null
    ip netns exec "$NS_PREFIX-$1" tc qdisc del dev eth0 root 2>/dev/null
    return 0
}
partition() {
    ip -n "$NS_PREFIX-$1" route add prohibit "$(ip_of "$2")/32" &&
        ip -n "$NS_PREFIX-$2" route add prohibit "$(ip_of "$1")/32"
}
heal() {
    ip -n "$NS_PREFIX-$1" route del prohibit "$(ip_of "$2")/32"
    ip -n "$NS_PREFIX-$2" route del prohibit "$(ip_of "$1")/32"
}

# grpod_up HOST [key=value...]: grpod on HOST, TCP with a secret, its state in $TMP/grpod.N.state (a fresh one
# each call; the previous grpod is ended first); waits until grpoctl (from HOST) reaches it
GRPOD_N=0
grpod_up() {
    local h="$1"; shift
    [ -n "${GRPOD_PID:-}" ] && { kill "$GRPOD_PID" 2>/dev/null; wait "$GRPOD_PID" 2>/dev/null; }
    GRPOD_N=$((GRPOD_N + 1))
    SECRET="$TMP/secret"
    [ -f "$SECRET" ] || { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$SECRET"; chmod 600 "$SECRET"; }
    EP="tcp://$(ip_of "$h"):$((7069 + GRPOD_N))"
    export GRPOD_ENDPOINT="$EP" GRPOD_SECRET_FILE="$SECRET"
    on "$h" "$GRPOD" grpod.endpoint="$EP" grpod.secret_file="$SECRET" grpod.state_dir="$TMP/grpod.$GRPOD_N.state" \
        grpod.http_listen=127.0.0.1:0 "$@" >>"$TMP/grpod.log" 2>&1 &
    GRPOD_PID=$!
    track "$GRPOD_PID"
    wait_for 20 on "$h" "$GRPOCTL" status >/dev/null
}
# ctl ARGS...: grpoctl from hostc (grpod's host)
ctl() { on hostc "$GRPOCTL" "$@"; }
