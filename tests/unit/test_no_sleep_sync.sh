#!/usr/bin/env bash
# scripts/check_test_sleeps.py: the tests as they are pass (their remaining synchronising sleeps are the listed
# debt of tests/sleep_debt.txt); a new sleep in a test fails naming its file and line, in shell, C and Python;
# a sleep marked `sleep-ok: WHY` (a fault's length, a measurement window) passes.
set -o pipefail
check="$1"
root="$2"
. "$(dirname "$0")/../lib.sh" no-sleep-test
fails=0
if out="$(python3 "$check" "$root" 2>&1)"; then
    echo "ok: the tests use no unlisted sleep ($(grep -o '[0-9]* known' <<<"$out" || echo 0) listed as debt)"
else
    echo "FAIL: $out"
    fails=$((fails + 1))
fi
plant() { # NAME FILE LINE EXPECT(fail|pass)
    local d="$TMP/$1"
    mkdir -p "$d/$(dirname "$2")"
    printf 'x\n%s\n' "$3" >"$d/$2"
    if out="$(python3 "$check" "$d" 2>&1)"; then
        [ "$4" = pass ] && echo "ok: $1 passes" || { echo "FAIL: $1 passed"; fails=$((fails + 1)); }
    elif [ "$4" = fail ] && grep -qF "$2:2:" <<<"$out"; then
        echo "ok: $1 refused"
    else
        echo "FAIL: $1: $out"
        fails=$((fails + 1))
    fi
}
plant shell tests/system/test_x.sh 'start_grpod g; sleep 2; step_at_least 1' fail
plant c tests/unit/test_x.c '    usleep(100000); /* let it start */' fail
plant python tests/mpi/x.py 'time.sleep(0.5)' fail
plant clock tests/unit/test_y.c '    clock_sleep_s(0.2);' fail
plant marked tests/system/test_y.sh 'sleep 8 # sleep-ok: the length of the fault is what is tested' pass
plant comment tests/system/test_z.sh '# no sleep 2 here, we wait_for the log line' pass
plant word tests/system/test_w.sh 'echo "asleep 3 times"' pass
[ "$fails" -eq 0 ] && echo "sleep check: all cases hold"
exit $((fails > 0))
