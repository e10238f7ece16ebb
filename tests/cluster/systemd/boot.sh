#!/usr/bin/env bash
# The init of a throwaway "host" for test_systemd_units.sh: run as PID 1 of new PID, mount and network namespaces
# (unshare --pid --fork --mount --net), it makes every place systemd or the units write private to the namespace,
# then execs systemd as the system manager (PID 1).
# usage: boot.sh STAGE   (STAGE: the test's directory with etc/, a copy of /etc holding the units, the grpo user
#                         and /etc/grpo; usr-local/: what goes to /usr/local)
# Nothing it does may reach the real host: mounts are private, and /tmp, /var/tmp, /run, /var/lib, /var/log,
# /var/cache, /usr/local (but for the host's entries other than bin/ and libexec/, bound back read-only) and /etc
# are tmpfs or the stage's copies (systemd-tmpfiles, masked in the copy anyway,
# empties /tmp at boot).
set -euo pipefail
stage="$1"
mount --make-rprivate /
ip link set lo up
mount -t tmpfs -o mode=0755 tmpfs /srv
mkdir /srv/t
mount --bind "$stage" /srv/t
mount --bind /srv/t/etc /etc
# /usr/local: a tmpfs for the units' programs (bin/, libexec/), with the host's other entries bound back read-only:
# libraries there (CUDA and NCCL under /usr/local/cuda*, which a CUDA build of grpo-worker loads) stay found
mkdir /srv/local
mount --bind /usr/local /srv/local
for d in /run /var/lib /var/log /var/cache /usr/local; do
    mount -t tmpfs -o mode=0755 tmpfs "$d"
done
for e in /srv/local/*; do
    n="${e##*/}"
    case "$n" in bin | libexec | '*') continue ;; esac
    if [ -d "$e" ] && [ ! -L "$e" ]; then
        mkdir -p "/usr/local/$n"
        mount --bind -o ro "$e" "/usr/local/$n"
    else
        cp -a "$e" "/usr/local/$n"
    fi
done
for d in /tmp /var/tmp; do
    mount -t tmpfs -o mode=1777 tmpfs "$d"
done
cp -a /srv/t/usr-local/. /usr/local/
exec /lib/systemd/systemd --system --unit=grpo-test.target
