#!/usr/bin/env bash
# scripts/check_key_names.py: the tree retypes no more key names in its messages than the recorded debt, and a
# message that retypes one (instead of KEY_field, from common/config_keys.def) fails the check, naming the
# file, the line and the macro to write; a key name outside a message, or in a comment, does not.
set -o pipefail
check="$1"
root="$2"
. "$(dirname "$0")/../lib.sh" key-names-test
tmp="$TMP"
plant() { # DESCRIPTION FILE LINE-2 EXPECT(fail|pass) [LINE OF THE KEY, 2]
    local d="$tmp/$1"
    mkdir -p "$d/$(dirname "$2")" "$d/common"
    cp "$root/common/config_keys.def" "$d/common/"
    printf '#include "common/log.h"\n%s\n' "$3" >"$d/$2"
    if out="$(python3 "$check" "$d" --max 0 2>&1)"; then
        [ "$4" = pass ] && echo "ok: $1 passes" || { echo "FAIL: $1 passed the check"; fails=$((fails + 1)); }
    elif [ "$4" = fail ] && grep -qF "$2:${5:-2}: \"data.train_files\" retyped in a message: write KEY_data_train_files" <<<"$out"; then
        echo "ok: $1 refused"
    else
        echo "FAIL: $1: $out"
        fails=$((fails + 1))
    fi
}
if out="$(python3 "$check" "$root" 2>&1)"; then
    echo "ok: the tree keeps within its debt: $out"
else
    echo "FAIL: more key names retyped in messages than the debt:"
    echo "$out"
    fails=$((fails + 1))
fi
plant log worker/trainer/x.c 'void f(void) { log_warn("x", "set data.train_files first"); }' fail
plant error-set common/x.c 'int f(char *e, size_t n) { return error_set(e, n, "%s: data.train_files", "y"); }' fail
plant multi-line daemon/x.c 'void f(int a) { log_error("x", "value %d:"
    " see data.train_files", a); }' fail 3
plant cfg-name worker/x.c 'void f(void) { log_warn("x", "set " KEY_data_train_files " first"); }' pass
plant lookup worker/y.c 'int f(void *c) { return config_is_set(c, "data.train_files"); }' pass
plant comment worker/z.c '/* log_warn("x", "data.train_files") */ int g(void);' pass
finish
