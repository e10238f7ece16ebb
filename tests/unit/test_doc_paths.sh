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
# links: a file of the tree and a heading of it pass; a missing file or heading is caught; web links are not checked
rm -f "$tmp/docs/ARCHITECTURE.md"
cat >"$tmp/docs/guide.md" <<'DOC'
# The guide
## Where the time goes (`run_x`)
DOC
cat >"$tmp/README.md" <<'DOC'
See [the guide](docs/guide.md), [its timing](docs/guide.md#where-the-time-goes-run_x) and [a site](https://example.org/x).
DOC
if python3 "$check" "$tmp" >/dev/null 2>&1; then echo "ok: links to a file and a heading pass"; else
    echo "FAIL: links to an existing file and heading were refused"
    fails=$((fails + 1))
fi
cat >"$tmp/README.md" <<'DOC'
See [the old guide](docs/old.md) and [a gone section](docs/guide.md#speed).
DOC
out="$(python3 "$check" "$tmp" 2>&1)"
rc=$?
for want in "README.md:1: link to docs/old.md: no file docs/old.md" \
    "README.md:1: link to docs/guide.md#speed: no heading #speed in docs/guide.md"; do
    if [ $rc -ne 0 ] && grep -qF "$want" <<<"$out"; then echo "ok: caught: $want"; else
        echo "FAIL: not caught (rc $rc): $want"
        echo "$out"
        fails=$((fails + 1))
    fi
done
finish
