#!/usr/bin/env bash
# scripts/check_doc_paths.py: every path the docs name exists in the tree, and a stale one is caught, naming the
# document, the line and the path.
set -o pipefail
check="$1"
root="$2"
. "$(dirname "$0")/../lib.sh" doc-paths-test
tmp="$TMP"
if out="$(python3 "$check" "$root" 2>&1)"; then
    echo "ok: every path the docs name exists"
else
    echo "FAIL: the docs name paths that do not exist:"
    echo "$out"
    fails=$((fails + 1))
fi
# a small tree: one real file, and docs that name it, a folder, a glob, a brace list, and stale paths
mkdir -p "$tmp/worker/plane" "$tmp/docs"
touch "$tmp/worker/plane/wire.c" "$tmp/worker/plane/dataplane.c"
cat >"$tmp/README.md" <<'DOC'
The codec is `worker/plane/wire.c`, in `worker/plane/`; all of `worker/plane/*.c`, or
`worker/plane/{wire,dataplane}.c`. The bare name wire.c is fine too.
DOC
if python3 "$check" "$tmp" >/dev/null 2>&1; then echo "ok: existing paths pass"; else
    echo "FAIL: a tree whose docs name only existing paths was refused"
    fails=$((fails + 1))
fi
cat >"$tmp/docs/ARCHITECTURE.md" <<'DOC'
Line one.
The old codec was `worker/rollout/wire.c`; see worker/plane/{wire,gone}.c and status_json.c.
DOC
out="$(python3 "$check" "$tmp" 2>&1)"
rc=$?
for want in "docs/ARCHITECTURE.md:2: worker/rollout/wire.c does not exist" \
    "docs/ARCHITECTURE.md:2: worker/plane/gone.c does not exist" \
    "docs/ARCHITECTURE.md:2: no file status_json.c in the tree"; do
    if [ $rc -ne 0 ] && grep -qF "$want" <<<"$out"; then echo "ok: caught: $want"; else
        echo "FAIL: not caught (rc $rc): $want"
        echo "$out"
        fails=$((fails + 1))
    fi
done
finish
