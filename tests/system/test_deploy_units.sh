#!/usr/bin/env bash
# deploy/*.service pass `systemd-analyze verify` (their binaries pointed at the build tree; skipped where
# systemd-analyze is absent), and grpod.service's own command line starts grpod with the shipped
# deploy/examples/grpod.yaml (its /run/grpo and port moved into a temporary directory, nothing else changed):
# grpod listens on the endpoint the YAML names, and with the YAML's commented tcp endpoint and secret turned on,
# on both (the unit must not override the YAML's endpoints). deploy/examples/grpod-alerts.yaml passes promtool's
# check and its own rule tests (skipped where promtool is absent). systemd runs the units in the cluster suite's
# systemd-units test.
# usage: test_deploy_units.sh (the units of this source tree; the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-deploy-units
grpod="$(prog grpod)" grpoctl="$(prog grpoctl)" src="$SRC_ROOT"
for u in grpod.service grpo-workers.service; do
    sed -e "s|/usr/local/bin/grpod |$grpod |; s|/usr/local/bin/grpoctl |$grpoctl |" \
        -e "s|/usr/local/libexec/grpo/grpo-launch-workers|$src/deploy/grpo-launch-workers|" \
        "$src/deploy/$u" >"$TMP/$u"
done
if command -v systemd-analyze >/dev/null; then
    for u in grpod.service grpo-workers.service; do
        systemd-analyze verify "$TMP/$u" >"$TMP/out" 2>&1
        rc=$?
        # verify prints problems of other units on the host too: count only lines about ours
        grep -E "^$u:|$TMP/$u" "$TMP/out" >"$TMP/ours"
        [ $rc -eq 0 ] && [ ! -s "$TMP/ours" ]; expect "systemd-analyze verify $u" $?
        cat "$TMP/ours"
    done
else
    echo "systemd-analyze not installed: the units are not verified"
fi
grep -q '^Type=notify' "$src/deploy/grpod.service"; expect "grpod.service is Type=notify" $?
for k in NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes StateDirectory=grpod \
    RuntimeDirectory=grpo; do
    grep -q "^$k" "$src/deploy/grpod.service"; expect "grpod.service has $k" $?
done
bash -n "$src/deploy/grpo-launch-workers"; expect "grpo-launch-workers parses" $?
bash -n "$src/deploy/slurm/grpo.sbatch"; expect "grpo.sbatch parses" $?
"$grpod" --config "$src/deploy/examples/grpod.yaml" --print-config >/dev/null; expect "examples/grpod.yaml loads" $?
"$grpod" --config "$src/deploy/examples/run.yaml" --print-config >/dev/null; expect "examples/run.yaml loads" $?

# ---- grpod started as the unit starts it, with the shipped example configuration
exec_line="$(sed -n 's/^ExecStart=//p' "$TMP/grpod.service")"
! grep -q "grpod.endpoint" <<<"$exec_line"; expect "grpod.service leaves grpod's endpoints to its YAML" $?
mkdir -p "$TMP/run" "$TMP/state" "$TMP/etc" && chmod 750 "$TMP/run"
# start_unit_grpod NAME CONFIG: the unit's ExecStart with /etc/grpo/grpod.yaml -> CONFIG and ${STATE_DIRECTORY}
# -> $TMP/state, log in $TMP/NAME.log, pid in UNIT_PID
start_unit_grpod() {
    local line="${exec_line//\/etc\/grpo\/grpod.yaml/$2}"
    line="${line//\$\{STATE_DIRECTORY\}/$TMP/state}"
    local cmd
    read -ra cmd <<<"$line"
    "${cmd[@]}" >"$TMP/$1.log" 2>&1 &
    UNIT_PID=$!
    track "$UNIT_PID"
}
# the shipped file, its runtime directory and HTTP port moved (the port: 0, any free one)
moved() { sed -e "s|/run/grpo/|$TMP/run/|g" -e "s|127.0.0.1:9464|127.0.0.1:0|" "$src/deploy/examples/grpod.yaml"; }
moved >"$TMP/etc/grpod.yaml"
[ "$(diff "$src/deploy/examples/grpod.yaml" "$TMP/etc/grpod.yaml" | grep -c '^>')" -le 3 ]
expect "the example configuration is changed only in its paths and port" $?
start_unit_grpod ipc "$TMP/etc/grpod.yaml"
wait_for 10 "$grpoctl" --endpoint "ipc://$TMP/run/ctl.sock" --retries 1 status >/dev/null
expect "grpod starts with the shipped grpod.yaml and listens on its endpoint ($TMP/run/ctl.sock)" $?
[ "$(stat -c %a "$TMP/run/ctl.sock" 2>/dev/null)" = 660 ]; expect "the control socket has the YAML's socket_mode 0660" $?
kill -TERM "$UNIT_PID"; wait "$UNIT_PID"; expect "grpod ends cleanly on SIGTERM" $?

# the same with the YAML's commented tcp endpoint and secret turned on (docs/operations.md's multi-host setup)
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
head -c 32 /dev/urandom | base64 >"$TMP/etc/secret" && chmod 600 "$TMP/etc/secret"
moved | sed -e '/^  endpoint: /d' -e 's|^  # endpoint: |  endpoint: |' -e 's|^  # secret_file: |  secret_file: |' \
    -e "s|:7070|:$port|" -e "s|/etc/grpo/secret|$TMP/etc/secret|" >"$TMP/etc/grpod-tcp.yaml"
grep -q "^  endpoint: ipc://$TMP/run/ctl.sock,tcp://\*:$port\$" "$TMP/etc/grpod-tcp.yaml"
expect "the example's tcp endpoint turned on" $?
start_unit_grpod tcp "$TMP/etc/grpod-tcp.yaml"
wait_for 10 "$grpoctl" --endpoint "tcp://127.0.0.1:$port" --secret-file "$TMP/etc/secret" --retries 1 status \
    >/dev/null
expect "grpod listens on the YAML's tcp endpoint (port $port)" $?
"$grpoctl" --endpoint "ipc://$TMP/run/ctl.sock" --retries 1 status >/dev/null
expect "and on its ipc endpoint" $?
kill -TERM "$UNIT_PID"; wait "$UNIT_PID"; expect "grpod ends cleanly on SIGTERM" $?

# the alerting rules: valid, and they fire on a lost worker, not on a suspect one (their own promtool tests; the
# names they use are checked against grpod's metrics by the grpod-stall test)
if command -v promtool >/dev/null; then
    promtool check rules "$src/deploy/examples/grpod-alerts.yaml" >"$TMP/rules.out" 2>&1
    expect "promtool check rules deploy/examples/grpod-alerts.yaml" $?
    (cd "$src/deploy/examples" && promtool test rules grpod-alerts.test.yaml) >>"$TMP/rules.out" 2>&1
    expect "promtool test rules: lost fires, suspect does not" $?
    cat "$TMP/rules.out"
else
    echo "promtool not installed: the alerting rules are not checked"
fi
finish
