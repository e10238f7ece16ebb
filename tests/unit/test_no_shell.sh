#!/usr/bin/env bash
# scripts/check_no_shell.py: the product's sources run no shell, and each way of running one that it exists
# to catch (system, popen, an exec of /bin/sh) fails the check naming the file and line; a mention in a
# comment or a string does not.
set -o pipefail
check="$1"
root="$2"
. "$(dirname "$0")/../lib.sh" no-shell-test
tmp="$TMP"
fails=0
plant() { # DESCRIPTION FILE LINE-2 EXPECT(fail|pass)
    local d="$tmp/$1"
    mkdir -p "$d/$(dirname "$2")"
    printf '#include <stdlib.h>\n%s\n' "$3" >"$d/$2"
    if out="$(python3 "$check" "$d" 2>&1)"; then
        [ "$4" = pass ] && echo "ok: $1 passes" || { echo "FAIL: $1 passed the check"; fails=$((fails + 1)); }
    elif [ "$4" = fail ] && grep -qF "$2:2:" <<<"$out"; then
        echo "ok: $1 refused: $out" | head -1
    else
        echo "FAIL: $1: $out"
        fails=$((fails + 1))
    fi
}
if out="$(python3 "$check" "$root" 2>&1)"; then
    echo "ok: the product runs no shell"
else
    echo "FAIL: the product runs a shell:"
    echo "$out"
    fails=$((fails + 1))
fi
plant system worker/trainer/x.c 'int f(const char *c) { return system(c); }' fail
plant popen daemon/x.c 'void *f(void) { return popen("ls", "r"); }' fail
plant exec-sh ctl/x.c 'int f(void) { return execl("/bin/sh", "sh", "-c", "ls", (char *)0); }' fail
plant sh-c common/x.c 'char *a[] = {"sh", "-c", "ls", 0};' fail
plant kernels kernels/cpu/x.h 'static inline int f(void) { return system ("x"); }' fail
plant comment worker/x.c '/* we never call system() here */ int f(void); // nor popen(' pass
plant string worker/y.c 'const char *s = "os.system(1); popen(";' pass
plant member worker/z.c 'struct s { int (*system)(int); }; int g(struct s *p) { return p->system(1); }' pass
[ "$fails" -eq 0 ] && echo "no-shell check: all cases hold"
exit $((fails > 0))
