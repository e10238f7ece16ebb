#!/usr/bin/env bash
# grpo-worker as an operator meets it: --help, --print-config with a file and
# overrides, clear errors with exit code 2 for bad input, the MPI selftest.
set -u
worker="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
expect() { # expect NAME CONDITION-RESULT
    if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
has() { grep -qF -- "$2" "$1"; }

"$worker" --help >"$tmp/help" 2>&1
expect "--help exits 0 and documents overrides" $(( $? != 0 )) 
has "$tmp/help" "key.path=value"; expect "--help mentions key.path=value" $?

cat >"$tmp/run.yaml" <<'Y'
data:
  train_batch_size: 16
actor_rollout_ref:
  rollout:
    n: 4
Y
"$worker" --config "$tmp/run.yaml" actor_rollout_ref.rollout.n=6 --print-config >"$tmp/out" 2>&1
expect "--print-config exits 0" $?
has "$tmp/out" "train_batch_size: 16  # $tmp/run.yaml:2"; expect "file value with its origin" $?
has "$tmp/out" "n: 6  # command line"; expect "override beats file" $?

printf 'data:\n  train_bach_size: 4\n' >"$tmp/bad.yaml"
"$worker" --config "$tmp/bad.yaml" >"$tmp/err" 2>&1
rc=$?
[ $rc -eq 2 ]; expect "unknown key exits 2 (got $rc)" $?
has "$tmp/err" "bad.yaml:2: unknown key 'data.train_bach_size' (did you mean 'data.train_batch_size'?)"
expect "unknown key error names file, line and suggestion" $?

"$worker" algorithm.adv_estimator=ppo >"$tmp/err" 2>&1
[ $? -eq 2 ]; expect "bad enum exits 2" $?
has "$tmp/err" "command line: algorithm.adv_estimator must be one of grpo|rloo|reinforce_plus_plus, got 'ppo'"
expect "bad enum error lists the choices" $?

"$worker" --config "$tmp/missing.yaml" >"$tmp/err" 2>&1
[ $? -eq 2 ]; expect "missing config file exits 2" $?
has "$tmp/err" "cannot open config file '$tmp/missing.yaml'"; expect "missing file named" $?

"$worker" stray-argument >"$tmp/err" 2>&1
[ $? -eq 2 ]; expect "stray argument exits 2" $?

mpirun --oversubscribe -np 4 "$worker" --selftest --tp 2 --pp 2 >"$tmp/st" 2>&1
expect "mpirun selftest tp=2 pp=2" $?
has "$tmp/st" "collective plane OK: 4 ranks (dp=1 tp=2 pp=2)"; expect "selftest reports the layout" $?

mpirun --oversubscribe -np 3 "$worker" --selftest --tp 2 >"$tmp/st" 2>&1
[ $? -ne 0 ]; expect "impossible layout fails" $?
has "$tmp/st" "3 ranks cannot be split into tp=2 x pp=1"; expect "impossible layout explained" $?

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
