#!/usr/bin/env bash
# grpod's HTTP side: /metrics passes `promtool check metrics`, /api/status is the
# JSON of `grpoctl status --json`, and the status page, rendered by headless
# Chromium after its script has run, shows the workers and draws both charts.
set -u
. "$(dirname "$0")/grpod_lib.sh"

start_grpod g1
start_sim w0 0 2 --steps 100000 --step-ms 30 --host hostA
start_sim w1 1 2 --steps 100000 --step-ms 30 --host hostB
wait_for 15 state_is running; expect "run runs" $?
url="$(status_field .http_url)"
case "$url" in http://127.0.0.1:[1-9]*) r=0 ;; *) r=1 ;; esac; expect "status names the HTTP URL ($url)" $r
wait_for 15 field_at_least '.history | length' 3; expect "history fills" $?

curl -sf "$url/metrics" >"$TMP/metrics"; expect "GET /metrics" $?
has "$TMP/metrics" 'grpod_run_state{state="running"} 1'; expect "/metrics has the run state" $?
has "$TMP/metrics" 'grpod_worker_up{rank="1",host="hostB",role="hybrid",state="running"} 1'; expect "/metrics has the workers" $?
if command -v promtool >/dev/null; then
    promtool check metrics <"$TMP/metrics" >"$TMP/promtool" 2>&1; expect "promtool check metrics passes" $?
    cat "$TMP/promtool"
else
    echo "skip promtool check (promtool not installed)"
fi
curl -sfI "$url/metrics" | grep -qi '^content-type: text/plain; version=0.0.4'; expect "/metrics content type" $?

curl -sf "$url/api/status" >"$TMP/api.json"; expect "GET /api/status" $?
jq -e '.state == "running" and (.workers | length) == 2 and (.history | length) >= 3' "$TMP/api.json" >/dev/null
expect "/api/status has the run, workers and history" $?
jq -e '.workers[0] | has("last_heartbeat_age_s") and has("idle_fraction") and has("role")' "$TMP/api.json" >/dev/null
expect "/api/status worker fields" $?
diff <(jq -S 'del(.uptime_s, .workers, .history, .events, .step, .metrics, .reward, .throughput, .phase)' "$TMP/api.json") \
     <("$GRPOCTL" status --json | jq -S 'del(.uptime_s, .workers, .history, .events, .step, .metrics, .reward, .throughput, .phase)') >/dev/null
expect "/api/status and grpoctl status --json agree" $?
jq -e '.workers_registered == 2' "$TMP/api.json" >/dev/null; expect "/api/status counts the workers registered" $?
curl -sf "$url/api/status?workers=1" >"$TMP/api1.json"; expect "GET /api/status?workers=1" $?
jq -e '(.workers | length) == 1 and .workers[0].rank == 0 and .workers_registered == 2' "$TMP/api1.json" >/dev/null
expect "?workers=1 lists one worker (the lowest rank: both run) and counts both" $?
curl -s -o "$TMP/bad.txt" -w '%{http_code}' "$url/api/status?workers=lots" | grep -q 400 &&
    grep -q 'bad workers= in /api/status' "$TMP/bad.txt"
expect "?workers=lots: 400 naming the argument" $?
curl -s -o /dev/null -w '%{http_code}' "$url/nope" | grep -q 404; expect "unknown path: 404" $?
curl -s -o /dev/null -w '%{http_code}' -X POST "$url/api/status" | grep -q 405; expect "POST: 405" $?

curl -sf "$url/" >"$TMP/page.html"; expect "GET /" $?
grep -q '<script' "$TMP/page.html" && ! grep -Eq 'src="https?:' "$TMP/page.html"; expect "page: inline script, no CDN" $?
chrome="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [ -n "$chrome" ]; then
    timeout "$(scaled 60)" "$chrome" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
        --user-data-dir="$TMP/chrome" --virtual-time-budget=8000 --dump-dom "$url/" >"$TMP/dom.html" 2>"$TMP/chrome.log"
    expect "chromium renders the page" $?
    grep -q '<tr data-rank="0">' "$TMP/dom.html" && grep -q '<tr data-rank="1">' "$TMP/dom.html"
    expect "DOM: worker table has both ranks" $?
    grep -q 'hostB' "$TMP/dom.html"; expect "DOM: worker host shown" $?
    grep -Eq 'id="run-state" class="badge running"' "$TMP/dom.html"; expect "DOM: run state badge" $?
    for c in reward throughput; do
        grep -Eo "<svg id=\"chart-$c\"[^>]*data-points=\"[0-9]+\"" "$TMP/dom.html" | grep -Eq 'data-points="([3-9]|[1-9][0-9]+)"'
        expect "DOM: $c chart has points" $?
        sed -n "/id=\"chart-$c\"/,/<\/svg>/p" "$TMP/dom.html" | grep -Eq '<polyline [^>]*points="[0-9.]+,[0-9.]+ [0-9.]+,[0-9.]+'
        expect "DOM: $c chart has a drawn line" $?
    done
    grep -q 'registered from host' "$TMP/dom.html"; expect "DOM: events listed" $?
    grep -Eo '<svg id="timeline"[^>]*data-spans="[0-9]+"' "$TMP/dom.html" | grep -Eq 'data-spans="[1-9][0-9]*"'
    expect "DOM: the timeline draws phase spans" $?
    grep -Eq '<rect [^>]*data-phase="(gen|update_actor)"' "$TMP/dom.html"; expect "DOM: timeline spans carry their phase" $?
else
    echo "skip chromium checks (chromium not installed)"
fi
"$GRPOCTL" stop --wait="$(scaled 30)" >/dev/null
finish
