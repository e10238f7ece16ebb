#!/usr/bin/env bash
# tests/lib.sh's cleanup kills what a test tracked and nothing else: a tracked process that still runs is killed
# at the test's exit, and a process that merely holds a tracked pid now (the pid reused after the tracked one
# ended: pid_max is 32768 on a busy machine, and another test's process once died so) is left alone.
# usage: test_lib_track.sh
set -u
. "$(dirname "$0")/../lib.sh" grpo-track
# a stand-in test: tracks KEEP's pid as if it had tracked an earlier process (another start time), and TRACKED
# itself; both run on after the stand-in's start, as processes of their own session
setsid sleep 300 & # sleep-ok: a process that runs on, the object of the test, not a wait
keep=$!
setsid sleep 300 & # sleep-ok: a process that runs on, the object of the test, not a wait
tracked=$!
bash -c '. "$1/tests/lib.sh" grpo-track-inner
PIDS+=("$2:1")
track "$3"
exit 0' _ "$SRC_ROOT" "$keep" "$tracked"
gone() { ! kill -0 "$1" 2>/dev/null || [ "$(awk '{ sub(/.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null)" = Z ]; }
wait_for 10 gone "$tracked"; expect "the tracked process is killed at the stand-in's exit" $?
kill -0 "$keep" 2>/dev/null; expect "the process under a tracked pid with another start time is left alone" $?
kill "$keep" "$tracked" 2>/dev/null
finish
