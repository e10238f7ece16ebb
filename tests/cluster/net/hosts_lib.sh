# shellcheck shell=bash
# The cluster suite's layer over tests/lib.sh: three "hosts" made of Linux network namespaces, Open MPI across them
# and grpod on TCP with its secret.
# usage: . hosts_lib.sh PREFIX   (then hosts_up)
# It gives, besides lib.sh's:
#   hosts_up            three hosts hosta, hostb, hostc: a bridge in the root namespace, a veth each with its own
#                       address ($NET.1-3/24), its own UTS name, an /etc/hosts naming all three
#                       (/etc/netns/NS/hosts, which `ip netns exec` mounts), and a private /tmp ($TMP/hosts.d/HOST in a
#                       mount namespace of its own) with $TMP mounted back at its path (the "shared file system"), and
#                       the checkout, the working directory and HOST_PROGRAMS/HOST_FILES too where they lie under /tmp
#                       (each by its top directory there). Each host is checked to start every one of HOST_PROGRAMS
#                       and read every one of HOST_FILES (absolute paths, or relative to the working directory; set
#                       by the test before hosts_up): a FAIL naming the host and the path at once otherwise. Torn down
#                       at exit, also on a failure; what a killed earlier run left (its owner gone) is cleared first
#                       (hosts_sweep). Exit 77 when not root or when namespaces cannot be made.
#   on HOST CMD...      CMD on HOST (its network, name and /tmp); exit 127 at once, naming CMD, when HOST cannot
#                       start it
#   wait_alive SECONDS PID CMD...       wait_for, but over at once (status 2) when PID ends first
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
#   host_crash HOST, host_boot HOST     HOST crashes: its link cut first, then every process on it SIGKILLed (its
#                       sshd and Open MPI daemon too): nothing reaches its peers, no FIN, no RST; booted again: link
#                       up, its sshd started again
#   $MPIRUN_NET         mpirun with the options that start remote ranks through a real ssh (MPI_AGENT=ssh): an
#                       sshd on every host (its own host key, root by key, its configuration under $TMP/ssh,
#                       started through on.sh, so it and its sessions have the host's network, name and /tmp) and
#                       the client's configuration $TMP/ssh/config. The client stays on the launching host and
#                       hears nothing from a crashed one, as with real hosts. Without sshd (HOSTS_SSH=0, or
#                       openssh-server missing: said at hosts_up) the agent is $TMP/rsh.sh (MPI_AGENT=rsh), which
#                       enters the host itself and so dies with it. Ranks on TCP over the bridge's network.
#                       $MPIRUN_NET_ARGS: the same options without mpirun and the agent ($MPI_AGENT_CMD)
#   grpod_up HOST [key=value...]        grpod on HOST on tcp://ADDR:7070 (7071, ... for the next ones) with a secret ($SECRET): $EP, GRPOD_PID,
#                       log $TMP/grpod.log (its tail shown when grpod does not answer; over at once when grpod
#                       ends); exported GRPOD_ENDPOINT/GRPOD_SECRET_FILE for grpoctl
. "$(dirname "${BASH_SOURCE[0]}")/../../lib.sh" "$1"
test_env

# Every name is one run's own: it carries the run's id, the test shell's pid (RUN_ID; interface names stay within
# 15 characters), and $OWNERS/ID records the owner before anything is made ("PID STARTTIME PIDNS TMP": a pid
# reused by another process is told apart by its start time). A run killed before its cleanup (meson sends SIGTERM
# and SIGKILL half a second later) leaves its namespaces, /etc/netns entries, bridge and veths behind: the next
# run's hosts_up clears those whose owner is gone (hosts_sweep), never a live run's.
RUN_ID=$$
NET_ID=$((RUN_ID % 200 + 20))
NS_PREFIX="gn$RUN_ID"
BRIDGE="gnbr$RUN_ID"
OWNERS=/run/grpo-net
STAGE="$OWNERS/$RUN_ID.stage" # where a host's /tmp is held while the host's own covers it
NET="10.77.$NET_ID"
HOSTS=(hosta hostb hostc)
NET_UP=0
MY_PIDNS="$(readlink /proc/self/ns/pid)"
# the build's programs the hosts run and the files they read (absolute paths; the test sets them before hosts_up):
# seen by every host wherever they are, checked by hosts_up
[ -n "${HOST_PROGRAMS+set}" ] || HOST_PROGRAMS=()
[ -n "${HOST_FILES+set}" ] || HOST_FILES=()

# start_time PID: the process's start time (clock ticks since boot; /proc/PID/stat's 22nd field)
start_time() {
    local s f
    s="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    read -r -a f <<<"${s##*) }" # from the 3rd field on: the command's name, in parentheses, may hold spaces
    echo "${f[19]}"
}
# owner_alive PID STARTTIME: the process PID that started at STARTTIME still runs
owner_alive() { [ -n "$2" ] && [ "$(start_time "$1")" = "$2" ]; }

# net_clear ID: everything of run ID in this machine's network and mount tables: the processes in its namespaces,
# the namespaces (their /run/netns mounts), /etc/netns entries, bridges, veths, TAP devices and its stage
net_clear() {
    local id="$1" n i
    for n in $(ip netns list 2>/dev/null | awk -v p="gn$id-" 'index($1, p) == 1 { print $1 }'); do
        ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$n" 2>/dev/null
    done
    rm -rf /etc/netns/gn"$id"-*
    for i in 0 1 2; do
        for n in gv gta gtb gnx; do ip link del "$n$id$i" 2>/dev/null; done
    done
    ip link del "gnq$id" 2>/dev/null
    ip link del "gnbr$id" 2>/dev/null
    awk -v a="/run/netns/gn$id-" -v b="$OWNERS/$id.stage" 'index($2, a) == 1 || $2 == b { print $2 }' \
        /proc/self/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
    rmdir "$OWNERS/$id.stage" "/run/grpo-net-$id" 2>/dev/null # (the second: the stage's place before the records)
    return 0
}

# hosts_sweep: clear what earlier runs left whose owner is gone (a record of this run's pid but of another start
# time included: a process before this one had the pid). A run recorded from another PID namespace is left alone
# (whether it lives cannot be told from here). Names from before the records (gnPID-HOST, gnbrPID) are cleared when
# PID is gone (or is this run's, before its record: nothing of it is made yet); their $TMP stays.
hosts_sweep() {
    local f id pid start ns tmp n done=" "
    mkdir -p "$OWNERS" || return 1
    for f in "$OWNERS"/*; do
        [ -f "$f" ] || continue
        id="${f##*/}"
        case "$id" in '' | *[!0-9]*) continue ;; esac
        pid="" start="" ns="" tmp=""
        read -r pid start ns tmp <"$f"
        [ "$ns" = "$MY_PIDNS" ] || continue
        owner_alive "$pid" "$start" && continue
        echo "     clearing what run $id left (its owner, pid $pid, is gone)"
        net_clear "$id"
        case "$tmp" in /tmp/grpo-?*) rm -rf -- "$tmp" ;; esac
        rm -f "$f"
    done
    for n in $({ ip netns list 2>/dev/null | awk '{ print $1 }'; ls /etc/netns 2>/dev/null
        ip -o link show type bridge 2>/dev/null | awk -F': ' '{ print $2 }'; } | sort -u); do
        case "$n" in gnbr*) id="${n#gnbr}" ;; gn*-*) id="${n#gn}" id="${id%%-*}" ;; *) continue ;; esac
        case "$id" in '' | *[!0-9]*) continue ;; esac
        [ -e "$OWNERS/$id" ] && continue
        [ "$id" != "$RUN_ID" ] && kill -0 "$id" 2>/dev/null && continue
        case "$done" in *" $id "*) continue ;; esac
        done="$done$id "
        echo "     clearing what run $id left (unrecorded, pid $id is gone)"
        net_clear "$id"
    done
    return 0
}

hosts_down() {
    [ "$NET_UP" = 1 ] || return 0
    net_clear "$RUN_ID"
    rm -f "$OWNERS/$RUN_ID"
    NET_UP=0
}
trap 'lib_cleanup; hosts_down' EXIT
# meson ends a test that runs out of time with SIGTERM (SIGKILL half a second later): clean up what can be
trap 'exit 143' TERM

skip() { echo "SKIP $*"; exit 77; }

hosts_up() {
    [ "$(id -u)" = 0 ] || skip "the cluster suite makes network namespaces: it needs root"
    command -v ip >/dev/null && command -v unshare >/dev/null && command -v tc >/dev/null ||
        skip "the cluster suite needs ip, tc (iproute2) and unshare (util-linux)"
    hosts_sweep || skip "cannot make $OWNERS"
    # the owner's record first: from here on a later run can clear what this one makes, should it be killed
    printf '%s %s %s %s\n' "$RUN_ID" "$(start_time "$RUN_ID")" "$MY_PIDNS" "$TMP" >"$OWNERS/$RUN_ID"
    NET_UP=1
    ip netns add "$NS_PREFIX-probe" 2>"$TMP/netns.err" || skip "cannot make a network namespace: $(cat "$TMP/netns.err")"
    ip netns del "$NS_PREFIX-probe"
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
        ip link add "gv${RUN_ID}$i" type veth peer name eth0 netns "$NS_PREFIX-$h" || return 1
        ip link set "gv${RUN_ID}$i" master "$BRIDGE" up
        printf -v "VETH_$h" '%s' "gv${RUN_ID}$i"
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
    # on.sh HOST CMD...: CMD in HOST's network namespace, with its own name and /tmp (enter.sh)
    cat >"$TMP/on.sh" <<EOF
#!/usr/bin/env bash
h="\$1"; shift
exec ip netns exec "$NS_PREFIX-\$h" unshare --uts --mount --propagation private -- /bin/bash "$TMP/enter.sh" "\$h" "\$@"
EOF
    # enter.sh HOST CMD...: HOST's name; its own /tmp ($TMP/hosts.d/HOST) with what the hosts share bound back at
    # their paths: $TMP (the "shared file system"), and the checkout and the build wherever they are (under /tmp
    # they were hidden: "No such file or directory" for every program of the build). Then CMD, or at once an error
    # naming it when the host cannot start it.
    {
        printf '#!/usr/bin/env bash\nset -e\nh="$1"; shift\nstage=%q tmp=%q\nkeep=(' "$STAGE" "$TMP"
        host_keep | while read -r i; do printf ' %q' "$i"; done
        printf ' )\n'
        cat <<'ENTER'
hostname "$h"
mount --rbind /tmp "$stage"
mount --bind "$tmp/hosts.d/$h" /tmp
for k in "${keep[@]}"; do
    if [ -d "$stage/$k" ]; then mkdir -p "/tmp/$k"; else : >"/tmp/$k"; fi
    mount --rbind "$stage/$k" "/tmp/$k"
done
umount -l "$stage"
set +e
if ! command -v "$1" >/dev/null; then
    case "$1" in
    */*) if [ -e "$1" ]; then why="not an executable"; else why="no such file or directory"; fi ;;
    *) why="not found in PATH" ;;
    esac
    echo "on $h: cannot start $1: $why" >&2
    exit 127
fi
exec "$@"
ENTER
    } >"$TMP/enter.sh"
    chmod +x "$TMP/rsh.sh" "$TMP/on.sh"
    on hostb true || skip "cannot enter a namespace host (ip netns exec + unshare)"
    on hosta bash -c 'exec 3<>/dev/tcp/hostb/9' 2>&1 | grep -q refused || { echo "FAIL hosta cannot reach hostb"; return 1; }
    hosts_can_start || return 1
    MPI_AGENT_CMD="$TMP/rsh.sh" MPI_AGENT=rsh
    if [ "${HOSTS_SSH:-1}" = 1 ]; then
        if ssh_up; then
            MPI_AGENT_CMD="ssh -F $TMP/ssh/config" MPI_AGENT=ssh
        else
            echo "     no sshd on the hosts ($SSH_WHY): Open MPI starts its daemons through $TMP/rsh.sh, which dies" \
                "with its host (a crash is not faithful: the phases that need one are skipped)"
        fi
    fi
    MPIRUN_NET_ARGS=(--oversubscribe --bind-to none
        --mca oob_tcp_if_include "$NET.0/24" --mca btl_tcp_if_include "$NET.0/24" --mca btl self,vader,tcp
        -x OPENBLAS_NUM_THREADS -x OMP_NUM_THREADS -x GRPO_COMM_SYNC_SENDS=1)
    MPIRUN_NET=(mpirun --mca plm_rsh_agent "$MPI_AGENT_CMD" "${MPIRUN_NET_ARGS[@]}")
}

# ssh_up: a real sshd on every host (sshd_start), root logging in by key, and the client's configuration
# $TMP/ssh/config (the key, each host's own host key known, batch mode) that Open MPI's remote launch uses. The
# client runs on the launching host and knows of a remote host only what reaches it over the network: a crashed
# host (host_crash) leaves it waiting, as ssh does. 1 with SSH_WHY when there is no sshd or it does not answer.
ssh_up() {
    local h d="$TMP/ssh"
    SSHD="$(command -v sshd || echo /usr/sbin/sshd)"
    [ -x "$SSHD" ] && command -v ssh >/dev/null && command -v ssh-keygen >/dev/null ||
        { SSH_WHY="sshd, ssh or ssh-keygen missing: install openssh-server (scripts/deps.sh)"; return 1; }
    mkdir -p "$d" && chmod 700 "$d" || { SSH_WHY="cannot make $d"; return 1; }
    # sshd's privilege separation directory (the machine's /run: the hosts share it)
    mkdir -p /run/sshd && chmod 755 /run/sshd
    ssh-keygen -q -t ed25519 -N '' -C grpo-test -f "$d/id" || { SSH_WHY="ssh-keygen failed"; return 1; }
    cp "$d/id.pub" "$d/authorized_keys"
    : >"$d/known_hosts"
    for h in "${HOSTS[@]}"; do
        ssh-keygen -q -t ed25519 -N '' -C "$h" -f "$d/host-$h" || { SSH_WHY="ssh-keygen failed"; return 1; }
        printf '%s,%s %s\n' "$h" "$(ip_of "$h")" "$(cut -d' ' -f1-2 "$d/host-$h.pub")" >>"$d/known_hosts"
        cat >"$d/sshd_config-$h" <<EOF
ListenAddress $(ip_of "$h"):22
HostKey $d/host-$h
PidFile $d/sshd-$h.pid
AuthorizedKeysFile $d/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
LogLevel ERROR
EOF
    done
    cat >"$d/config" <<EOF
Host ${HOSTS[*]}
    User root
    IdentityFile $d/id
    IdentitiesOnly yes
    UserKnownHostsFile $d/known_hosts
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    ConnectTimeout 10
    LogLevel ERROR
EOF
    for h in "${HOSTS[@]}"; do sshd_start "$h" || return 1; done
    return 0
}
# sshd_start HOST: HOST's sshd (through on.sh: the host's network, name and /tmp, which its sessions inherit), log
# $TMP/ssh/sshd-HOST.log; waits until a login from hostc runs a command there (1 with SSH_WHY if not in 20 s)
sshd_start() {
    local h="$1"
    on "$h" "$SSHD" -D -e -f "$TMP/ssh/sshd_config-$h" >>"$TMP/ssh/sshd-$h.log" 2>&1 &
    track $!
    printf -v "SSHD_PID_$h" '%s' $!
    ssh_answers() { [ "$(on hostc ssh -F "$TMP/ssh/config" "$1" hostname 2>/dev/null)" = "$1" ]; }
    wait_alive 20 $! ssh_answers "$h" && return 0
    SSH_WHY="the sshd of $h does not answer: $(tail -n 3 "$TMP/ssh/sshd-$h.log" | tr '\n' ' ')"
    return 1
}
# host_crash HOST: HOST crashes: its link is cut first (so that nothing more reaches its peers: no FIN, no RST),
# then every process on it is SIGKILLed (its sshd and Open MPI daemon too). Its peers learn nothing from the
# network; an ssh client on another host that logged in there waits as for a silent host.
host_crash() {
    link_down "$1" || return 1
    ip netns pids "$NS_PREFIX-$1" | xargs -r kill -9
    local left
    gone_all() { [ -z "$(ip netns pids "$NS_PREFIX-$1")" ]; }
    wait_for 10 gone_all "$1" || { left=$(ip netns pids "$NS_PREFIX-$1" | wc -l); echo "     $left process(es) left on $1"; return 1; }
}
# host_boot HOST: HOST back after host_crash: its link up and its services (host_services) started again
host_boot() {
    link_up "$1" || return 1
    host_services "$1"
}
# host_services HOST: what a host runs before any job, started again after every process on it was killed: its
# sshd when the hosts run sshd (mpirun starts its daemons through it)
host_services() {
    [ "${MPI_AGENT:-rsh}" = ssh ] || return 0
    sshd_start "$1"
}

# host_keep: what the hosts must see under /tmp although their /tmp is their own: the top directories (one a line,
# relative to /tmp) of $TMP, the checkout ($SRC_ROOT), the working directory (meson's is the checkout: the programs
# come as paths relative to it, and pyenv's python3 shim changes to it by name) and each of HOST_PROGRAMS and
# HOST_FILES, those that lie under /tmp
host_keep() {
    local p t root
    root="$(realpath /tmp)"
    for p in "$TMP" "$SRC_ROOT" "$PWD" "${HOST_PROGRAMS[@]}" "${HOST_FILES[@]}"; do
        p="$(realpath -m "$p")"
        case "$p" in "$root"/?*) ;; *) continue ;; esac
        t="${p#"$root"/}"
        echo "${t%%/*}"
    done | sort -u
}

# hosts_can_start: every host sees each of HOST_PROGRAMS as a program it can start and each of HOST_FILES as a file
# it can read; else a FAIL naming the host, the path and why, at once (not each case waiting to its own bound)
hosts_can_start() {
    local h out line ok=0
    [ $((${#HOST_PROGRAMS[@]} + ${#HOST_FILES[@]})) -gt 0 ] || return 0
    for h in "${HOSTS[@]}"; do
        # shellcheck disable=SC2016
        out="$(on "$h" /bin/bash -c 'n=$1; shift; i=0
            for p; do
                i=$((i + 1))
                if [ ! -e "$p" ]; then echo "$p: no such file or directory"
                elif [ $i -le "$n" ] && { [ ! -f "$p" ] || [ ! -x "$p" ]; }; then echo "$p: not an executable"
                elif [ ! -r "$p" ]; then echo "$p: not readable"; fi
            done' can_start "${#HOST_PROGRAMS[@]}" "${HOST_PROGRAMS[@]}" "${HOST_FILES[@]}" 2>&1)" || ok=1
        [ -z "$out" ] || ok=1
        while read -r line; do
            [ -n "$line" ] || continue
            if [ -e "${line%: *}" ]; then
                fail "$h cannot start or read $line (the machine has it: the host does not see it)"
            else
                fail "$h cannot start or read $line (not on the machine either)"
            fi
        done <<<"$out"
    done
    return $ok
}

# wait_alive SECONDS PID CMD...: wait_for (SECONDS scaled as its), but over at once (status 2) when PID has ended
# before CMD succeeds
wait_alive() {
    local s="$1" pid="$2" until
    shift 2
    until=$(($(date +%s%N) / 1000000 + $(scaled "$s") * 1000))
    while :; do
        "$@" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || { "$@" 2>/dev/null && return 0; return 2; }
        [ $(($(date +%s%N) / 1000000)) -ge "$until" ] && return 1
        sleep 0.1 # sleep-ok: the poll interval of a bounded wait
    done
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
    ip link add "gnq$RUN_ID" type veth peer name "gnr$RUN_ID" 2>/dev/null || return 1
    tc qdisc add dev "gnq$RUN_ID" root netem delay 1ms 2>/dev/null && ok=0
    ip link del "gnq$RUN_ID" 2>/dev/null
    return $ok
}
# host_index HOST: 0, 1 or 2
host_index() { local i; for i in 0 1 2; do [ "${HOSTS[$i]}" = "$1" ] && echo $i; done; }
# impair_on HOST ARGS...: link_impair on HOST's link. Path of a frame from HOST: eth0 -> veth -> its root end on
# bridge gnxIDI -> TAP gtaIDI -> link_impair (drop or hold) -> TAP gtbIDI on the main bridge -> the other hosts
# (ID: RUN_ID, I: the host's index); the reverse path the same way back. A TAP device without offloads gets whole segmented, checksummed frames.
impair_on() {
    local h="$1" i; shift
    i=$(host_index "$h")
    [ -x "${LINK_IMPAIR:-}" ] || { echo "link_impair is not built (LINK_IMPAIR=${LINK_IMPAIR:-})"; return 1; }
    ip link add "gnx${RUN_ID}$i" type bridge && ip link set "gnx${RUN_ID}$i" up &&
        ip tuntap add dev "gta${RUN_ID}$i" mode tap && ip tuntap add dev "gtb${RUN_ID}$i" mode tap &&
        ip link set "gta${RUN_ID}$i" master "gnx${RUN_ID}$i" up && ip link set "gtb${RUN_ID}$i" master "$BRIDGE" up || return 1
    "$LINK_IMPAIR" "gta${RUN_ID}$i" "gtb${RUN_ID}$i" "$@" >"$TMP/impair-$h.log" 2>&1 &
    printf -v "IMPAIR_PID_$h" '%s' $!
    track $!
    wait_for 10 has "$TMP/impair-$h.log" "link_impair: forwarding" ||
        { echo "link_impair did not start: $(cat "$TMP/impair-$h.log")"; return 1; }
    # only now, with the way through ready, the host's link leaves the main bridge
    ip link set "$(veth_of "$h")" nomaster && ip link set "$(veth_of "$h")" master "gnx${RUN_ID}$i"
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
    ip link del "gta${RUN_ID}$i" 2>/dev/null
    ip link del "gtb${RUN_ID}$i" 2>/dev/null
    ip link del "gnx${RUN_ID}$i" 2>/dev/null
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
    wait_alive 20 "$GRPOD_PID" on "$h" "$GRPOCTL" status >/dev/null && return 0
    echo "     grpod on $h does not answer ($(kill -0 "$GRPOD_PID" 2>/dev/null && echo "after 20 s" || echo "it ended")):"
    tail -n 5 "$TMP/grpod.log" | sed 's/^/     | /'
    return 1
}
# ctl ARGS...: grpoctl from hostc (grpod's host)
ctl() { on hostc "$GRPOCTL" "$@"; }
