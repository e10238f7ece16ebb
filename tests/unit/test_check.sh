#!/usr/bin/env bash
# A source check of scripts/ on the tree as it is and on planted trees of one file: each way of breaking its rule
# fails the check naming the file and the line, and the look-alikes pass. One meson test per check:
#  - key_names (scripts/check_key_names.py): the tree retypes no more key names in its messages than the recorded
#    debt, and a message that retypes one (instead of KEY_field, from common/config_keys.def) fails the check, naming
#    the file, the line and the macro to write; a key name outside a message, or in a comment, does not;
#  - no_shell (scripts/check_no_shell.py): the product's sources run no shell, and each way of running one that it
#    exists to catch (system, popen, an exec of /bin/sh) fails the check; a mention in a comment or a string does not;
#  - no_sleep_sync (scripts/check_test_sleeps.py): the tests as they are pass (their remaining synchronising sleeps
#    are the listed debt of tests/sleep_debt.txt); a new sleep in a test fails, in shell, C and Python; a sleep
#    marked `sleep-ok: WHY` (a fault's length, a measurement window) passes. (The check skips this file: its
#    planted sleeps are below.)
# usage: test_check.sh CHECK   (key_names, no_shell or no_sleep_sync; the check of this source tree)
set -o pipefail
. "$(dirname "$0")/../lib.sh" "check-$1-test"
name="$1"

# Each check's own: its script, the first line of a planted file, what else a planted tree needs (files of this
# tree), the check's arguments on a planted tree, and what its refusal says after FILE:LINE:
COPY=() ARGS=() WANT=""
case "$name" in
key_names)
    CHECK=scripts/check_key_names.py HEAD='#include "common/log.h"' COPY=(common/config_keys.def) ARGS=(--max 0)
    WANT=' "data.train_files" retyped in a message: write KEY_data_train_files' ;;
no_shell) CHECK=scripts/check_no_shell.py HEAD='#include <stdlib.h>' ;;
no_sleep_sync) CHECK=scripts/check_test_sleeps.py HEAD=x ;;
*) echo "FAIL test_check.sh: no check named '$name'"; exit 1 ;;
esac

# the tree as it is
out="$(python3 "$SRC_ROOT/$CHECK" "$SRC_ROOT" 2>&1)"
rc=$?
expect "$CHECK passes on the tree: $(tail -n 1 <<<"$out")" $rc
[ $rc -eq 0 ] || echo "$out"

# plant CASE FILE TEXT pass|fail [LINE]: a tree of FILE ($HEAD, then TEXT) passes the check, or fails it naming
# FILE:LINE (default 2) and $WANT
plant() {
    local d="$TMP/$1" f out rc ok
    for f in "$2" "${COPY[@]}"; do mkdir -p "$d/$(dirname "$f")"; done
    for f in "${COPY[@]}"; do cp "$SRC_ROOT/$f" "$d/$f"; done
    printf '%s\n%s\n' "$HEAD" "$3" >"$d/$2"
    out="$(python3 "$SRC_ROOT/$CHECK" "$d" "${ARGS[@]}" 2>&1)"
    rc=$?
    if [ "$4" = pass ]; then
        [ $rc -eq 0 ]
        ok=$?
        expect "$1 passes" $ok
    else
        [ $rc -ne 0 ] && grep -qF "$2:${5:-2}:$WANT" <<<"$out"
        ok=$?
        expect "$1 refused, naming $2:${5:-2}" $ok
    fi
    [ $ok -eq 0 ] || echo "$out"
}

case "$name" in
key_names)
    plant log worker/trainer/x.c 'void f(void) { log_warn("x", "set data.train_files first"); }' fail
    plant error-set common/x.c 'int f(char *e, size_t n) { return error_set(e, n, "%s: data.train_files", "y"); }' fail
    plant multi-line daemon/x.c 'void f(int a) { log_error("x", "value %d:"
    " see data.train_files", a); }' fail 3
    plant cfg-name worker/x.c 'void f(void) { log_warn("x", "set " KEY_data_train_files " first"); }' pass
    plant lookup worker/y.c 'int f(void *c) { return config_is_set(c, "data.train_files"); }' pass
    plant comment worker/z.c '/* log_warn("x", "data.train_files") */ int g(void);' pass ;;
no_shell)
    plant system worker/trainer/x.c 'int f(const char *c) { return system(c); }' fail
    plant popen daemon/x.c 'void *f(void) { return popen("ls", "r"); }' fail
    plant exec-sh ctl/x.c 'int f(void) { return execl("/bin/sh", "sh", "-c", "ls", (char *)0); }' fail
    plant sh-c common/x.c 'char *a[] = {"sh", "-c", "ls", 0};' fail
    plant kernels kernels/cpu/x.h 'static inline int f(void) { return system ("x"); }' fail
    plant comment worker/x.c '/* we never call system() here */ int f(void); // nor popen(' pass
    plant string worker/y.c 'const char *s = "os.system(1); popen(";' pass
    plant member worker/z.c 'struct s { int (*system)(int); }; int g(struct s *p) { return p->system(1); }' pass ;;
no_sleep_sync)
    plant shell tests/system/test_x.sh 'start_grpod g; sleep 2; step_at_least 1' fail
    plant c tests/unit/test_x.c '    usleep(100000); /* let it start */' fail
    plant python tests/mpi/x.py 'time.sleep(0.5)' fail
    plant clock tests/unit/test_y.c '    clock_sleep_s(0.2);' fail
    plant marked tests/system/test_y.sh 'sleep 8 # sleep-ok: the length of the fault is what is tested' pass
    plant comment tests/system/test_z.sh '# no sleep 2 here, we wait_for the log line' pass
    plant word tests/system/test_w.sh 'echo "asleep 3 times"' pass ;;
esac
finish
