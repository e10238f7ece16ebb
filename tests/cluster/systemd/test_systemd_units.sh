#!/usr/bin/env bash
# deploy/grpod.service and deploy/grpo-workers.service run by systemd as PID 1: a throwaway host made of new PID,
# mount and network namespaces (boot.sh: everything systemd writes is private to it) boots systemd with the units
# installed as docs/operations.md installs them (binaries in /usr/local, grpo-launch-workers in
# /usr/local/libexec/grpo, the user from deploy/grpo.sysusers.conf, /etc/grpo/grpod.yaml and workers.env the shipped
# examples unchanged; the run is the tiny split run of tests/system/tiny_split.sh, the hostfile this host).
#  - systemctl start grpod: the Type=notify unit is active, grpod serves grpoctl on /run/grpo/ctl.sock;
#  - systemctl start grpo-workers: mpirun starts a trainer and a rollout rank as user grpo, the run makes steps;
#  - systemctl stop grpo-workers: ExecStop's grpoctl stop --wait exits 0, the workers checkpoint the step they
#    stopped at, and the unit ends inactive with result success;
#  - again with ranks that take 2 s to exit after the run: the relaunch resumes from the checkpoint, the stop
#    waits for mpirun to end (no SIGTERM to it) and the unit ends with success.
# Skipped (77) when not root, when systemd, unshare or nsenter are missing, or when namespaces cannot be made.
# usage: test_systemd_units.sh (the units of this source tree; the build's programs by name, tests/lib.sh)
set -u
if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: needs root (namespaces, and systemd as PID 1)"
    exit 77
fi
for p in /lib/systemd/systemd systemd-sysusers unshare nsenter; do
    command -v "$p" >/dev/null || { echo "SKIP: $p is not installed (scripts/deps.sh installs systemd)"; exit 77; }
done
if ! err="$(unshare --pid --fork --mount --net --mount-proc true 2>&1)"; then
    echo "SKIP: cannot make PID, mount and network namespaces here: $err"
    exit 77
fi
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../../lib.sh" grpo-systemd
. "$here/../../system/tiny_split.sh"
src="$SRC_ROOT"
chmod 755 "$TMP"

# ---- the stage: /etc (a copy), /usr/local, the run's files; inside, it is /srv/t
cp -a /etc "$TMP/etc"
rm -rf "$TMP/etc/systemd/system" "$TMP/etc/grpo"
mkdir -p "$TMP/etc/systemd/system" "$TMP/etc/grpo" "$TMP/usr-local/bin" "$TMP/usr-local/libexec/grpo"
install -m 755 "$(prog grpod)" "$(prog grpoctl)" "$(prog grpo-worker)" "$TMP/usr-local/bin/"
install -m 755 "$src/deploy/grpo-launch-workers" "$TMP/usr-local/libexec/grpo/"
install -m 644 "$src/deploy/grpod.service" "$src/deploy/grpo-workers.service" "$TMP/etc/systemd/system/"
# the target systemd boots to: nothing but itself (the units are started by hand)
printf '[Unit]\nDescription=grpo test host\n' >"$TMP/etc/systemd/system/grpo-test.target"
# what boots with sysinit.target and would touch the machine (tmpfiles empties /tmp, sysctl writes /proc/sys, ...)
# is masked; journald stays
for u in /lib/systemd/system/sysinit.target.wants/* /lib/systemd/system/sockets.target.wants/* \
    systemd-tmpfiles-clean.timer systemd-remount-fs.service tmp.mount ldconfig.service systemd-update-done.service \
    systemd-hwdb-update.service systemd-journal-catalog-update.service systemd-udevd.service \
    systemd-udev-trigger.service; do
    u="$(basename "$u")"
    case "$u" in systemd-journald.service | systemd-journald.socket | systemd-journald-dev-log.socket) continue ;; esac
    ln -sf /dev/null "$TMP/etc/systemd/system/$u"
done
systemd-sysusers --root="$TMP" "$src/deploy/grpo.sysusers.conf"
expect "deploy/grpo.sysusers.conf makes the grpo user" $?
uid="$(awk -F: '$1 == "grpo" { print $3 }' "$TMP/etc/passwd")"
gid="$(awk -F: '$1 == "grpo" { print $3 }' "$TMP/etc/group")"
install -m 644 "$src/deploy/examples/grpod.yaml" "$src/deploy/examples/workers.env" "$TMP/etc/grpo/"
echo "localhost slots=2" >"$TMP/etc/grpo/hostfile"
tiny_split "$TMP"
expect "tiny model and split run configuration" $?
# the run: long, a step at least 0.3 s; inside, the stage is /srv/t
sed -e "s|$TMP|/srv/t|g" -e 's/total_training_steps: 3/total_training_steps: 1000000, total_epochs: 1000000/' \
    -e '/^grpod:/d' "$TMP/split.yaml" >"$TMP/etc/grpo/run.yaml"
echo 'test: {delay_phase: update_actor, delay_s: [0.3]}' >>"$TMP/etc/grpo/run.yaml"
mkdir -p "$TMP/runs" && chown "$uid:$gid" "$TMP/runs"

# ---- boot
unshare --pid --fork --mount --net --mount-proc "$here/boot.sh" "$TMP" >"$TMP/boot.log" 2>&1 &
ns=$!
track "$ns"
pid1=""
wait_for 10 bash -c "pgrep -P $ns >/dev/null" && pid1="$(pgrep -P "$ns")"
# in_host CMD...: CMD in the throwaway host
in_host() { nsenter --target "$pid1" --mount --pid --net -- "$@"; }
[ -n "$pid1" ] && wait_for 60 bash -c "$(declare -f in_host); pid1=$pid1; in_host systemctl is-active grpo-test.target"
expect "systemd boots as PID 1 of the throwaway host" $?
in_host cat /proc/1/comm | grep -qx systemd; expect "PID 1 there is systemd" $?

in_host timeout "$(scaled 60)" systemctl start grpod
expect "systemctl start grpod (Type=notify: returns once grpod said READY=1)" $?
in_host systemctl is-active grpod >/dev/null; expect "grpod.service is active" $?
in_host grpoctl --endpoint ipc:///run/grpo/ctl.sock --retries 1 status >"$TMP/status0.txt" 2>&1
expect "grpod serves grpoctl on the shipped grpod.yaml's endpoint, /run/grpo/ctl.sock" $?
[ "$(in_host stat -c '%U %a' /run/grpo/ctl.sock)" = "grpo 660" ]
expect "the socket belongs to grpo, mode 0660" $?

in_host timeout "$(scaled 60)" systemctl start grpo-workers
expect "systemctl start grpo-workers" $?
wait_for 120 steps_logged "$TMP/runs/p/e/metrics.jsonl" 3
expect "the workers (mpirun from the hostfile, as grpo) make steps" $?

[ "$(stat -c %u "$TMP/runs/p/e/metrics.jsonl" 2>/dev/null)" = "$uid" ]
expect "the run's files belong to the grpo user" $?

in_host timeout "$(scaled 120)" systemctl stop grpo-workers
expect "systemctl stop grpo-workers" $?
in_host systemctl show grpo-workers -p Result -p ActiveState >"$TMP/stopped.txt"
in_host journalctl --no-pager -u grpo-workers >"$TMP/workers.log" 2>&1
# a failed ExecStop would be logged ("Control process exited, code=exited, status=1/FAILURE") and end the unit failed
grep -q "grpoctl\[[0-9]*\]: run finished at step [0-9]*: stopped by operator" "$TMP/workers.log" &&
    ! grep -q "Control process exited" "$TMP/workers.log"
expect "ExecStop's grpoctl stop --wait saw the run stop, and exited 0" $?
grep -qx "Result=success" "$TMP/stopped.txt" && grep -qx "ActiveState=inactive" "$TMP/stopped.txt"
expect "the unit ended inactive with result success (it ended failed: SIGTERM to mpirun while its ranks ended)" $?
k="$(sed -n 's/.*worker: run stopped at step \([0-9]*\);.*/\1/p' "$TMP/workers.log" | tail -n 1)"
[ -n "$k" ] && [ -f "$TMP/runs/p/e/checkpoints/global_step_$k/actor/model.safetensors" ]
expect "the workers wrote the checkpoint of the step they stopped at (${k:-none})" $?

# ---- again, each rank taking 2 s to exit after the run ended (a slow file system or MPI_Finalize: the window in
# which the unit used to SIGTERM mpirun, which then ended its ranks and exited 1); the relaunch resumes
printf '#!/bin/sh\n/usr/local/bin/grpo-worker "$@"\nrc=$?\nsleep 2\nexit $rc\n' >"$TMP/slow-exit-worker"
chmod 755 "$TMP/slow-exit-worker"
echo "GRPO_WORKER=/srv/t/slow-exit-worker" >>"$TMP/etc/grpo/workers.env"
seen=$(wc -l <"$TMP/workers.log")
in_host timeout "$(scaled 60)" systemctl start grpo-workers
expect "systemctl start grpo-workers again (ranks that exit slowly)" $?
wait_for 120 bash -c "$(declare -f in_host); pid1=$pid1
    in_host journalctl --no-pager -u grpo-workers | tail -n +$((seen + 1)) | grep -q 'step  *$((k + 2))/'"
expect "the run resumes from step ${k:-none} and makes steps" $?
in_host timeout "$(scaled 120)" systemctl stop grpo-workers
expect "systemctl stop grpo-workers" $?
in_host systemctl show grpo-workers -p Result -p ActiveState >"$TMP/stopped2.txt"
in_host journalctl --no-pager -u grpo-workers | tail -n +$((seen + 1)) >"$TMP/workers2.log"
grep -q "resumed from .*global_step_$k at step $k" "$TMP/workers2.log"
expect "the relaunch resumed from the stop's checkpoint" $?
grep -qx "Result=success" "$TMP/stopped2.txt" && grep -qx "ActiveState=inactive" "$TMP/stopped2.txt" &&
    ! grep -q "Control process exited\|SIGTERM received" "$TMP/workers2.log"
expect "the unit waited for mpirun: no SIGTERM to the ranks, result success" $?
k2="$(sed -n 's/.*worker: run stopped at step \([0-9]*\);.*/\1/p' "$TMP/workers2.log" | tail -n 1)"
[ -n "$k2" ] && [ "$k2" -gt "$k" ] && [ -f "$TMP/runs/p/e/checkpoints/global_step_$k2/actor/model.safetensors" ]
expect "and the workers checkpointed the step they stopped at (${k2:-none})" $?

in_host timeout "$(scaled 30)" systemctl stop grpod
expect "systemctl stop grpod" $?
in_host journalctl --no-pager -u grpod >"$TMP/grpod.log" 2>&1
kill -KILL "$pid1" 2>/dev/null
finish "$TMP/workers.log" "$TMP/workers2.log" "$TMP/grpod.log" "$TMP/boot.log"
