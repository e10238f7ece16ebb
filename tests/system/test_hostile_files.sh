#!/usr/bin/env bash
# Files an attacker (or an accident) can shape, where the product reads: a FIFO, a directory or a device in
# place of a secret file, a configuration, a dataset or grpod's journal is refused at once with its kind named
# (a FIFO's read would wait for a writer forever); a journal that is not a regular file or is over 64 MiB is set
# aside (run.json.unreadable-TIME) and grpod starts a new run, as for any unreadable journal.
# Each program runs under `timeout` only as a guard: the checks are on the exit status and the message.
set -u
. "$(dirname "$0")/grpod_lib.sh"
port=$(( 10000 + RANDOM % 20000 ))
TCP="tcp://127.0.0.1:$port"
guard() { timeout -k 5 "$(scaled 60)" "$@"; }

mkfifo "$TMP/fifo"
mkdir "$TMP/dir"

# grpod: the secret file
guard "$GRPOD" grpod.endpoint="$TCP" grpod.secret_file="$TMP/fifo" grpod.state_dir="$TMP/s0" >"$TMP/err" 2>&1
rc=$?
[ $rc -eq 2 ]; expect "grpod: a FIFO as grpod.secret_file exits 2 (got $rc; 124 is a hang)" $?
says "$TMP/err" "a FIFO, not a regular file"; expect "... naming it a FIFO" $?
guard "$GRPOD" grpod.endpoint="$TCP" grpod.secret_file=/dev/zero grpod.state_dir="$TMP/s0" >"$TMP/err" 2>&1
[ $? -eq 2 ]; expect "grpod: a device as grpod.secret_file exits 2" $?
says "$TMP/err" "a character device, not a regular file"; expect "... naming it a device" $?

# grpoctl: the secret file
guard "$GRPOCTL" --endpoint "$TCP" --secret-file "$TMP/fifo" status >"$TMP/err" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ]; expect "grpoctl: a FIFO as the secret file is refused (rc $rc)" $?
says "$TMP/err" "a FIFO, not a regular file"; expect "... naming it a FIFO" $?

# grpo-worker: the configuration and the dataset
guard "$WORKER" --config "$TMP/fifo" >"$TMP/err" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ]; expect "grpo-worker: a FIFO as --config is refused (rc $rc)" $?
says "$TMP/err" "a FIFO, not a regular file"; expect "... naming it a FIFO" $?
guard "$WORKER" --config "$TMP/dir" >"$TMP/err" 2>&1
[ $? -ne 0 ]; expect "grpo-worker: a directory as --config is refused" $?
says "$TMP/err" "a directory, not a regular file"; expect "... naming it a directory" $?

# grpod's journal: a FIFO, then a file over 64 MiB (sparse), each set aside; grpod serves a new run
for kind in fifo big; do
    st="$TMP/j-$kind.state"
    mkdir -m 0750 "$st"
    if [ $kind = fifo ]; then mkfifo "$st/run.json"; else truncate -s 65M "$st/run.json"; fi
    "$GRPOD" grpod.endpoint="$EP" grpod.state_dir="$st" grpod.http_listen=127.0.0.1:0 >"$TMP/grpod-$kind.log" 2>&1 &
    GRPOD_PID=$!
    track "$GRPOD_PID"
    wait_for 20 "$GRPOCTL" status >/dev/null; expect "grpod with a $kind run.json starts and answers" $?
    says "$TMP/grpod-$kind.log" "starting a new run"; expect "... saying it starts a new run" $?
    ls "$st"/run.json.unreadable-* >/dev/null 2>&1; expect "... the $kind journal kept aside as run.json.unreadable-*" $?
    stop_grpod
done
says "$TMP/grpod-fifo.log" "a FIFO, not a regular file"; expect "the FIFO journal is named a FIFO" $?
says "$TMP/grpod-big.log" "over the 67108864-byte limit"; expect "the big journal is named over the limit" $?
finish
