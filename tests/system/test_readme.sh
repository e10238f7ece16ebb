#!/usr/bin/env bash
# The README stays true (issue 42 item 5): one page; the commands of its code blocks name scripts that exist and
# run (./scripts/X: executable, --help answers) and programs that are built, and the configuration keys they pass
# are accepted by grpo-worker as written (--print-config, with the files they name stood in for). Its links are
# checked with every doc's by doc_paths.
# usage: test_readme.sh (the build's grpo-worker by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-readme
README="$SRC_ROOT/README.md"

lines=$(wc -l <"$README")
[ "$lines" -le 100 ]; expect "README.md is one page: $lines lines (at most 100)" $?

# the lines of the code blocks, continuations joined
python3 - "$README" >"$TMP/commands.txt" <<'PY'
import sys
out, cur, code = [], "", False
for line in open(sys.argv[1], encoding="utf-8"):
    if line.startswith("```"):
        code = not code
        continue
    if not code:
        continue
    line = line.split("#", 1)[0].rstrip() if line.lstrip().startswith(("./", "build/", "mpirun")) or cur else line.rstrip()
    cur += line.rstrip("\\").strip() + " "
    if not line.endswith("\\"):
        if cur.strip():
            out.append(cur.strip())
        cur = ""
print("\n".join(out))
PY
n=$(grep -c . "$TMP/commands.txt")
[ "$n" -ge 3 ]; expect "the README's code blocks hold $n commands" $?
while read -r cmd; do
    set -- $cmd
    [ "$1" = mpirun ] && { while [ $# -gt 0 ] && [[ "$1" != build/* ]]; do shift; done; }
    prog="${1:-}"
    shift
    case "$prog" in
    ./scripts/*)
        [ -x "$SRC_ROOT/$prog" ] && "$SRC_ROOT/$prog" --help >"$TMP/help.txt" 2>&1 && [ -s "$TMP/help.txt" ]
        expect "$prog exists, is executable and answers --help" $? ;;
    build/worker/grpo-worker)
        keys=()
        for a in "$@"; do
            case "$a" in
            --config) ;;
            run.yaml) keys+=(--config "$TMP/run.yaml") ;;
            actor_rollout_ref.model.path=*) ;;
            data.train_files=* | data.val_files=*) keys+=("${a%%=*}=$TMP/prompts.jsonl") ;;
            *) keys+=("$a") ;;
            esac
        done
        echo "trainer: {project_name: readme}" >"$TMP/run.yaml"
        echo '{"prompt": "What is 1 + 1?", "ground_truth": "2", "data_source": "arithmetic"}' >"$TMP/prompts.jsonl"
        "$WORKER" --print-config "${keys[@]}" >"$TMP/print.txt" 2>&1
        rc=$?; expect "grpo-worker takes the README's keys: ${keys[*]} ($(grep -m1 -i 'unknown key\|not available\|refused' "$TMP/print.txt"))" $rc ;;
    *) fail "a README command this test does not know how to check: $cmd" ;;
    esac
done <"$TMP/commands.txt"
finish
