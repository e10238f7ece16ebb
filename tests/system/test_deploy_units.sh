#!/usr/bin/env bash
# deploy/*.service pass `systemd-analyze verify` (their binaries pointed at the build
# tree). Exit 77 (skipped) where systemd-analyze is absent.
set -u
command -v systemd-analyze >/dev/null || { echo "skip: systemd-analyze not installed"; exit 77; }
. "$(dirname "$0")/../lib.sh" grpo-deploy-units
need_bin grpod "$1"
need_bin grpoctl "$2"
src="$(realpath "$3")"
for u in grpod.service grpo-workers.service; do
    sed -e "s|/usr/local/bin/grpod |$grpod |; s|/usr/local/bin/grpoctl |$grpoctl |" \
        -e "s|/usr/local/libexec/grpo/grpo-launch-workers|$src/deploy/grpo-launch-workers|" \
        "$src/deploy/$u" >"$TMP/$u"
done
for u in grpod.service grpo-workers.service; do
    systemd-analyze verify "$TMP/$u" >"$TMP/out" 2>&1
    rc=$?
    # verify prints problems of other units on the host too: count only lines about ours
    grep -E "^$u:|$TMP/$u" "$TMP/out" >"$TMP/ours"
    [ $rc -eq 0 ] && [ ! -s "$TMP/ours" ]; expect "systemd-analyze verify $u" $?
    cat "$TMP/ours"
done
grep -q '^Type=notify' "$src/deploy/grpod.service"; expect "grpod.service is Type=notify" $?
for k in NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes StateDirectory=grpod \
    RuntimeDirectory=grpo; do
    grep -q "^$k" "$src/deploy/grpod.service"; expect "grpod.service has $k" $?
done
bash -n "$src/deploy/grpo-launch-workers"; expect "grpo-launch-workers parses" $?
bash -n "$src/deploy/slurm/grpo.sbatch"; expect "grpo.sbatch parses" $?
"$grpod" --config "$src/deploy/examples/grpod.yaml" --print-config >/dev/null; expect "examples/grpod.yaml loads" $?
"$grpod" --config "$src/deploy/examples/run.yaml" --print-config >/dev/null; expect "examples/run.yaml loads" $?
finish
