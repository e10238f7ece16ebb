# shellcheck shell=bash
# The hang tests' layer over grpod_lib.sh (sourced by test_hang.sh and test_hang_collective.sh): a tiny run of 2
# ranks under a fresh grpod whose verdict comes after 3 s of waiting, and the checks of grpoctl diagnose's first
# finding against the status page's.
# usage: . hang_lib.sh   (then test_env, tiny_model "$TMP/tiny")
. "$(dirname "${BASH_SOURCE[0]}")/grpod_lib.sh"

# hang NAME [key=value ...]: a fresh grpod (grpod.hang_wait_s=3) and 2 ranks under it with the keys given, left
# running (MPI_PID); the run's directory is $TMP/NAME/p/e, its log $TMP/NAME.log. LAYOUT: the layout's keys (default
# 2 colocated ranks)
hang() {
    local name="$1"; shift
    local layout=(${LAYOUT:-trainer.nnodes=1 trainer.n_gpus_per_node=2})
    EP="ipc://$TMP/$name.sock"
    export GRPOD_ENDPOINT="$EP"
    start_grpod "$name" grpod.hang_wait_s=3 || { fail "$name: grpod starts"; return 1; }
    local keys
    tiny_run keys "$TMP/$name" 50
    mpirun --oversubscribe --bind-to none -np 2 "$WORKER" "${keys[@]}" "${layout[@]}" \
        grpod.endpoint="$EP" grpod.connect_timeout_s=30 "$@" >"$TMP/$name.log" 2>&1 &
    MPI_PID=$!
    track "$MPI_PID"
}
# verdict KIND: grpoctl diagnose --json's first finding is of KIND (saved in $TMP/diag.json)
verdict() {
    "$GRPOCTL" diagnose --json >"$TMP/diag.json" 2>/dev/null && [ "$(jq -r '.[0].kind' "$TMP/diag.json")" = "$1" ]
}
# saw_verdict KIND: verdict KIND comes within 60 s (scaled); when it does not, what grpoctl diagnose found instead and
# where each rank was (its phase and open wait), for the log
saw_verdict() {
    wait_for 60 verdict "$1" && return 0
    echo "     | no $1 verdict; grpoctl diagnose --json found:"
    jq -c '.[]' "$TMP/diag.json" 2>&1 | sed 's/^/     |   /'
    echo "     | and the ranks (grpoctl status --json):"
    "$GRPOCTL" status --json 2>&1 | jq -c '.workers[] | {rank, role, state, step, phase, current_wait}' 2>&1 |
        sed 's/^/     |   /'
    return 1
}
# seconds_out: the text on stdin with its seconds as "N s" (they grow between two looks at a hang)
seconds_out() { sed -E 's/[0-9]+ s\b/N s/g'; }
# one_look URL KIND: grpoctl diagnose --json (saved in $TMP/diag.json; its first finding still of KIND), the status
# page's /api/status and grpoctl diagnose's text, taken one after another, have the same first finding
one_look() {
    local text
    "$GRPOCTL" diagnose --json >"$TMP/diag.json" 2>/dev/null &&
        [ "$(jq -r '.[0].kind' "$TMP/diag.json")" = "$2" ] &&
        text="$(jq -r '.[0].text' "$TMP/diag.json" | seconds_out)" &&
        curl -sf "$1/api/status" >"$TMP/page.json" &&
        [ "$(jq -r '.diagnosis[0].text' "$TMP/page.json" | seconds_out)" = "$text" ] &&
        [ "$(jq -r '.diagnosis[0].kind' "$TMP/page.json")" = "$2" ] &&
        "$GRPOCTL" diagnose >"$TMP/diag.txt" 2>&1 &&
        [ "$(grep -m1 '^warn  ' "$TMP/diag.txt" | seconds_out)" = "warn  $text" ]
}
# same_on_page: grpoctl diagnose's first finding (of the kind in $TMP/diag.json) is the first on the status page's
# /api/status and the first warning of grpoctl diagnose's text, in looks taken within 30 s (scaled): a rank that is
# not the stuck one may move between the three (CI once saw them differ, with no trace of how); when they never
# agree, the three, for the log
same_on_page() {
    local url kind
    url="$(status_field .http_url)"
    kind="$(jq -r '.[0].kind' "$TMP/diag.json")"
    wait_for 30 one_look "$url" "$kind" && return 0
    echo "     | the three looks never agreed; the last ones:"
    jq -c '.[0] | {kind, text}' "$TMP/diag.json" 2>&1 | sed 's/^/     |   diagnose --json: /'
    jq -c '.diagnosis[0] | {kind, text}' "$TMP/page.json" 2>&1 | sed 's/^/     |   \/api\/status: /'
    grep -m1 '^warn  ' "$TMP/diag.txt" 2>&1 | sed 's/^/     |   diagnose: /'
    return 1
}
