#!/usr/bin/env bash
# The control plane at scale, with simulated ranks that speak the real protocol and generate nothing
# (build/bench/sim_ranks): one grpod, WORKERS registered ranks heartbeating every second, and one trainer rank 0
# running the real dispatcher for ROLLOUT simulated rollout ranks. Measured (docs/scaling.md, "The control plane
# at scale"):
#  - registration: the time for every rank to register, and its latency;
#  - grpod's CPU share over WINDOW seconds of steady heartbeats (/proc/PID/stat), its resident memory;
#  - the status page's latency: GET /api/status and GET / (curl's time_total, STATUS_GETS each, sequential);
#  - the journal's bytes per hour: grpod_journal_bytes_total over the window, times 3600 / window, the ranks'
#    heartbeats saying a new step every STEP_S seconds (grpod journals its state whole once a step);
#  - grants per second through one dispatcher serving ROLLOUT rollout ranks, STEPS steps (each step's units all
#    granted before the next version is published), and the weight bytes it served per version (FLOATS floats).
#
#   bench/run_scale_bench.sh                       # WORKERS=10000 ROLLOUT=1000 WINDOW=60
#   WORKERS=2000 ROLLOUT=200 WINDOW=20 bench/run_scale_bench.sh
#   PHASES=dispatch ROLLOUT=512 FLOATS=65536 bench/run_scale_bench.sh   # the dispatcher alone
#   REGISTER_TIMEOUT=2 PHASES=registry bench/run_scale_bench.sh          # registrations retried as grpo-worker's
#   RELAY=2 PHASES=dispatch ROLLOUT=512 STEPS=3 FLOATS=262144 bench/run_scale_bench.sh  # the weight relay tree
#
# RELAY=K (0, the default: off): the weight relay tree of fan-out K (actor_rollout_ref.rollout.weight_relay_fanout):
# the simulated rollout ranks take each version from the dispatcher or from another rank's relay, as it says, and
# serve it on relays of their own (worker/plane/relay.h); the summary adds the relays' bytes out.
#
# Each sim_ranks process holds at most PER_PROC ranks (nanomsg allows 512 sockets a process; a rollout rank uses
# two). Everything runs at nice 15 on loopback ipc sockets under $OUT; results in $OUT/summary.md (default
# build/bench-results/scale-<time>/).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
WORKERS="${WORKERS:-10000}"
ROLLOUT="${ROLLOUT:-1000}"
WINDOW="${WINDOW:-60}"
STEPS="${STEPS:-5}"
FLOATS="${FLOATS:-65536}"
PER_PROC="${PER_PROC:-500}"
STATUS_GETS="${STATUS_GETS:-10}"
STEP_S="${STEP_S:-30}"
REGISTER_TIMEOUT="${REGISTER_TIMEOUT:-0}" # 2: give up a registration after 2 s and retry, as grpo-worker does
RELAY="${RELAY:-0}"
PHASES="${PHASES:-registry dispatch}"
OUT="${OUT:-$BUILD/bench-results/scale-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SIM="$BUILD/bench/sim_ranks"
GRPOD="$BUILD/daemon/grpod"
for p in "$SIM" "$GRPOD"; do
    [ -x "$p" ] || { echo "run_scale_bench: $p is not built (ninja -C $BUILD bench/sim_ranks daemon/grpod)" >&2; exit 2; }
done
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
log() { echo "[scale] $*" >&2; }
HZ=$(getconf CLK_TCK)
cpu_ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }
rss_mib() { awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
# grpod's own numbers. /metrics lists every worker (megabytes at 10,000: seconds of grpod's loop), so the waits below
# read /api/status?workers=1 instead: how many are registered, and the first one listed, which is one not at work
# when there is any
metric() { { curl -s --max-time 120 "http://127.0.0.1:$2/metrics" || true; } | awk -v m="$1" 'index($0, m) == 1 { s += $2 } END { print s + 0 }'; }
status1() { { curl -s --max-time 60 "http://127.0.0.1:$1/api/status?workers=1" || true; } | jq -r "$2" 2>/dev/null || true; }
registered() { local n; n=$(status1 "$1" .workers_registered); echo "${n:-0}"; }
all_running() { [ "$(status1 "$1" '.workers_registered == '"$2"' and .workers[0].state == "running"')" = true ]; }

# start_grpod NAME WORLD: a grpod on $OUT/NAME, one trainer rank and WORLD-1 rollout ranks; sets GPID, HTTP, EP
start_grpod() {
    local dir="$OUT/$1"
    mkdir -p "$dir"
    EP="ipc://$dir/ctl.sock"
    HTTP=$((20000 + ($$ + RANDOM) % 20000))
    nice -n 15 env GRPO_LOG_LEVEL=warn "$GRPOD" grpod.endpoint="$EP" grpod.state_dir="$dir/state" \
        grpod.http_listen=127.0.0.1:$HTTP grpod.data_endpoint="ipc://$dir/data" grpod.heartbeat_timeout_s=30 \
        placement.trainer_ranks=1 placement.rollout_ranks=$(($2 - 1)) data.train_batch_size=$(($2 - 1)) actor_rollout_ref.actor.ppo_mini_batch_size=$(($2 - 1)) >"$dir/grpod.log" 2>&1 &
    GPID=$!
    PIDS+=("$GPID")
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$HTTP/metrics" >/dev/null 2>&1 && return 0
        kill -0 "$GPID" 2>/dev/null || break
        sleep 0.1
    done
    echo "run_scale_bench: grpod did not serve http://127.0.0.1:$HTTP ($dir/grpod.log):" >&2
    tail -5 "$dir/grpod.log" >&2
    exit 1
}

# sims NAME WORLD FIRST COUNT SECONDS [ARGS...]: sim_ranks processes of PER_PROC ranks each for [FIRST, FIRST+COUNT)
sims() {
    local name=$1 world=$2 first=$3 count=$4 secs=$5 i=0
    shift 5
    while [ "$count" -gt 0 ]; do
        local n=$((count < PER_PROC ? count : PER_PROC))
        nice -n 15 "$SIM" --endpoint "$EP" --world "$world" --first "$first" --count "$n" --seconds "$secs" \
            --launch "$LAUNCH" "$@" >"$OUT/$name/sim-$i.out" 2>"$OUT/$name/sim-$i.err" &
        PIDS+=("$!")
        SIMPIDS+=("$!")
        first=$((first + n))
        count=$((count - n))
        i=$((i + 1))
    done
}

LAUNCH=$(printf '%x' $(( ($$ << 16) ^ RANDOM + 1 )))
{
    echo "# The control plane at scale ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
    echo
    echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo +modified), $(nproc) cores,"\
        "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(uname -r)"
    echo
} >"$OUT/summary.md"

if [[ " $PHASES " == *" registry "* ]]; then
    log "registry: $WORKERS ranks, $((WORKERS / PER_PROC + (WORKERS % PER_PROC > 0))) sim_ranks processes"
    start_grpod registry "$WORKERS"
    SIMPIDS=()
    t0=$(date +%s.%N)
    rc0=$(cpu_ticks "$GPID")
    sims registry "$WORKERS" 0 "$WORKERS" $((WINDOW + 600)) --step-s "$STEP_S" --step-base "$(date +%s)" \
        --register-timeout "$REGISTER_TIMEOUT"
    # the event: every rank registered and heartbeating (grpod's own count), or a sim gave up
    while :; do
        n=$(registered "$HTTP")
        [ "${n:-0}" -ge "$WORKERS" ] 2>/dev/null && break
        for p in "${SIMPIDS[@]}"; do
            kill -0 "$p" 2>/dev/null || { log "a sim_ranks process ended early (see $OUT/registry/sim-*.err)"; break 2; }
        done
        sleep 0.5
    done
    t1=$(date +%s.%N)
    rc1=$(cpu_ticks "$GPID")
    n=$(registered "$HTTP")
    reg_s=$(echo "$t1 - $t0" | bc)
    # the window starts once every rank has said it runs (their first heartbeats; each a change grpod journals)
    for _ in $(seq 600); do
        all_running "$HTTP" "$n" && break
        sleep 0.1
    done
    log "registered $n of $WORKERS in $reg_s s, every one running: $(all_running "$HTTP" "$n" && echo yes || echo no); measuring $WINDOW s"
    curl -s --max-time 120 "http://127.0.0.1:$HTTP/metrics" >"$OUT/registry/metrics0.txt" || true
    m0() { awk -v m="$1" 'index($0, m) == 1 { s += $2 } END { print s + 0 }' "$OUT/registry/metrics0.txt"; }
    j0=$(m0 grpod_journal_bytes_total); s0=$(m0 grpod_journal_saves_total)
    js0=$(m0 grpod_journal_seconds_total); r0=$(m0 grpod_journal_records_total)
    h0=$(m0 'grpod_requests_total{type="heartbeat"}')
    for p in "${SIMPIDS[@]}"; do kill -USR1 "$p"; done # the sims' latencies from here on
    c0=$(cpu_ticks "$GPID"); w0=$(date +%s.%N)
    sleep "$WINDOW" # the measured window itself: a fixed span by design, not a wait for an event
    c1=$(cpu_ticks "$GPID"); w1=$(date +%s.%N)
    for p in "${SIMPIDS[@]}"; do kill -USR2 "$p"; done # the window's heartbeat latencies
    curl -s --max-time 120 "http://127.0.0.1:$HTTP/metrics" >"$OUT/registry/metrics1.txt" || true
    m1() { awk -v m="$1" 'index($0, m) == 1 { s += $2 } END { print s + 0 }' "$OUT/registry/metrics1.txt"; }
    j1=$(m1 grpod_journal_bytes_total); s1=$(m1 grpod_journal_saves_total)
    js1=$(m1 grpod_journal_seconds_total); r1=$(m1 grpod_journal_records_total)
    h1=$(m1 'grpod_requests_total{type="heartbeat"}')
    rss=$(rss_mib "$GPID")
    for p in "${SIMPIDS[@]}"; do kill -USR1 "$p"; done # and from here, those while the status is read
    # the status page: sequential GETs while the heartbeats go on
    for path in /api/status "/api/status?workers=64" / /metrics; do
        f="${path//[\/?=]/_}"
        : >"$OUT/registry/get-$f.txt"
        for _ in $(seq "$STATUS_GETS"); do
            curl -s -o "$OUT/registry/body$f" -w '%{time_total} %{size_download}\n' \
                "http://127.0.0.1:$HTTP$path" >>"$OUT/registry/get-$f.txt"
        done
    done
    state_bytes=$(stat -c %s "$OUT/registry/state/run.json" 2>/dev/null || echo 0)
    n_status=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["workers"]))' \
        "$OUT/registry/body_api_status" 2>/dev/null || echo "?")
    reps=$(awk '$1 == "grpod_registrations_repeated_total" { print $2 }' "$OUT/registry/metrics1.txt")
    for p in "${SIMPIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${SIMPIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    python3 - "$OUT" "$WORKERS" "$n" "$n_status" "$reg_s" "$c0" "$c1" "$w0" "$w1" "$HZ" "$j0" "$j1" "$s0" "$s1" \
        "$h0" "$h1" "$rss" "$state_bytes" "$STEP_S" "$js0" "$js1" "$r0" "$r1" "$rc0" "$rc1" "${reps:-0}" <<'PY' | tee -a "$OUT/summary.md"
import glob, sys, statistics as st
(out, want, n, n_status, reg_s, c0, c1, w0, w1, hz, j0, j1, s0, s1, h0, h1, rss, state_bytes, step_s, js0, js1, r0, r1, rc0, rc1, reps) = sys.argv[1:]
wall = float(w1) - float(w0)
cpu = (float(c1) - float(c0)) / float(hz) / wall
def gets(path):
    v = sorted(float(l.split()[0]) for l in open(f"{out}/registry/get-{path}.txt"))
    size = int(open(f"{out}/registry/get-{path}.txt").readline().split()[1])
    return v[len(v) // 2] * 1e3, v[-1] * 1e3, size
api = gets("_api_status")
api64 = gets("_api_status_workers_64")
prom = gets("_metrics")
page = gets("_")
def lines(f):
    return [dict(kv.split("=", 1) for kv in l.split()[1:]) for l in open(f) if l.startswith("sim_ranks:")]
per = [lines(f) for f in sorted(glob.glob(f"{out}/registry/sim-*.out"))]
win = [l[0] for l in per if len(l) >= 2]   # printed at the window's end (SIGUSR2)
gets_ = [l[-1] for l in per if len(l) >= 2]  # at the end: while the status was read
errs = sum(int(l[-1]["errors"]) for l in per if l)
worst = lambda rows, k: max(float(r[k]) for r in rows) if rows else float("nan")
hb50, hb99, hbmax = worst(win, "heartbeat_ms_p50"), worst(win, "heartbeat_ms_p99"), worst(win, "heartbeat_ms_max")
ghb99, ghbmax = worst(gets_, "heartbeat_ms_p99"), worst(gets_, "heartbeat_ms_max")
reg99 = worst(win, "register_ms_p99")
hb_rate = (float(h1) - float(h0)) / wall
jb = float(j1) - float(j0)
print(f"## Registry: {want} simulated ranks, one grpod\n")
print(f"| measure | value |\n|---|---|")
print(f"| ranks registered (grpod's count; /api/status lists) | {n} ({n_status}) |")
reg_cpu = (float(rc1) - float(rc0)) / float(hz)
tries = sum(int(l[0]["reg_tries"]) for l in per if l)
touts = sum(int(l[0]["reg_timeouts"]) for l in per if l)
retries = sum(int(l[0]["reg_retries"]) for l in per if l)
print(f"| time to register them all | {float(reg_s):.1f} s (register p99 {reg99:.1f} ms from the first try, worst sim process) |")
print(f"| registrations sent | {tries} ({touts} given up after a timeout, {retries} answered 'retry', {reps} answered again by grpod) |")
print(f"| grpod CPU meanwhile | {reg_cpu:.1f} s ({1e3 * reg_cpu / max(int(n), 1):.2f} ms a registration, heartbeats of those registered included) |")
print(f"| heartbeats answered per second | {hb_rate:.0f} |")
print(f"| heartbeat latency in the window, worst sim process | p50 {hb50:.1f} ms, p99 {hb99:.1f} ms, max {hbmax:.1f} ms |")
print(f"| heartbeat latency while the status GETs below ran | p99 {ghb99:.1f} ms, max {ghbmax:.1f} ms |")
print(f"| grpod CPU over {wall:.0f} s of heartbeats | {100 * cpu:.1f} % of one core |")
print(f"| grpod resident memory | {rss} MiB |")
print(f"| GET /api/status (median, max of {len(open(f'{out}/registry/get-_api_status.txt').readlines())}) | {api[0]:.0f} ms, {api[1]:.0f} ms ({api[2]} bytes) |")
print(f"| GET /api/status?workers=64 (what the page asks) | {api64[0]:.0f} ms, {api64[1]:.0f} ms ({api64[2]} bytes) |")
print(f"| GET / (the page) | {page[0]:.0f} ms, {page[1]:.0f} ms ({page[2]} bytes) |")
print(f"| GET /metrics (a Prometheus scrape) | {prom[0]:.0f} ms, {prom[1]:.0f} ms ({prom[2]} bytes) |")
print(f"| journal: state files written whole in the window | {float(s1) - float(s0):.0f} ({state_bytes} bytes each now), {float(js1) - float(js0):.2f} s of grpod's loop |")
print(f"| journal: records appended in the window | {float(r1) - float(r0):.0f} |")
print(f"| journal bytes per hour (window x 3600 / {wall:.0f} s; a step every {step_s} s) | {jb * 3600 / wall / 1e6:.1f} MB |")
print(f"| sim errors | {errs} |\n")
PY
    kill -TERM "$GPID" 2>/dev/null || true
    wait "$GPID" 2>/dev/null || true
fi

if [[ " $PHASES " == *" dispatch "* ]]; then
    W=$((ROLLOUT + 1))
    log "dispatch: $ROLLOUT rollout ranks, one trainer rank 0 with the dispatcher, $STEPS steps of $FLOATS floats"
    start_grpod dispatch "$W"
    SIMPIDS=()
    nice -n 15 "$SIM" --endpoint "$EP" --world "$W" --trainer --units "$ROLLOUT" --steps "$STEPS" --floats "$FLOATS" \
        --seconds 540 --launch "$LAUNCH" --relay "$RELAY" >"$OUT/dispatch/trainer.out" 2>"$OUT/dispatch/trainer.err" &
    TPID=$!
    PIDS+=("$TPID")
    per=$PER_PROC
    PER_PROC=$((per / 2)) # two sockets a rollout rank; four with the relay tree (its relay, and one to another's)
    [ "$RELAY" -gt 0 ] && PER_PROC=$((per / 4))
    sims dispatch "$W" 1 "$ROLLOUT" 560 --rollout --units "$ROLLOUT" --relay "$RELAY"
    PER_PROC=$per
    wait "$TPID" || log "the trainer failed (see $OUT/dispatch/trainer.err)"
    for p in "${SIMPIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    python3 - "$OUT" "$ROLLOUT" <<'PY' | tee -a "$OUT/summary.md"
import glob, sys
out, units = sys.argv[1:]
def kv(f):
    return [dict(x.split("=", 1) for x in l.split()[1:] if "=" in x) for l in open(f) if l.startswith("sim_ranks:")]
t = kv(f"{out}/dispatch/trainer.out")
sims = [s for f in sorted(glob.glob(f"{out}/dispatch/sim-*.out")) for s in kv(f)]
print(f"## Dispatcher: {units} simulated rollout ranks, one trainer rank 0\n")
if not t:
    print("the trainer reported nothing: see trainer.err\n")
    sys.exit(0)
t = t[0]
print("| measure | value |\n|---|---|")
print(f"| steps, units granted | {t['steps']}, {t['granted']} (regranted {t['regranted']}, lost {t['lost']}, refused {t['refused']}, rate limited {t['rate_limited']}) |")
print(f"| grants per second | {float(t['grants_per_s']):.0f} |")
print(f"| trainer rank 0's CPU (the dispatcher's threads) | {float(t['cpu_s']):.2f} s over {float(t['wall_s']):.1f} s ({1e3 * float(t['cpu_s']) / max(int(t['granted']), 1):.2f} ms a grant, its version's chunks included) |")
print(f"| a step's units, publish to last grant | mean {float(t['step_round_s_mean']):.2f} s, max {float(t['step_round_s_max']):.2f} s |")
print(f"| weight bytes out of trainer rank 0 per version ({t['floats']} floats: {4 * int(t['floats'])} bytes) | {float(t['weight_bytes_per_version']):.0f} ({float(t['weight_bytes_per_version']) / (4 * int(t['floats'])):.1f} copies) |")
if int(t.get('relay', 0)) > 0 and sims:
    steps = max(int(t['steps']), 1)
    rb = sum(int(s['relay_bytes']) for s in sims)
    print(f"| relay tree, fan-out {t['relay']}: relay asks answered with a holder / 'from here' / failed relays named | {t['relay_named']} / {t['relay_direct']} / {t['relay_failed']} |")
    print(f"| versions taken from a relay, relay waits (asked again), direct fetches (rollout ranks' count) | {sum(int(s['relayed']) for s in sims)}, {sum(int(s['relay_waits']) for s in sims)}, {sum(int(s['direct']) for s in sims)} |")
    mx = max(int(s['relay_bytes_max']) for s in sims)
    print(f"| the relays' bytes out per version: in all; the most one relay sent (the run's total / steps) | {rb / steps:.0f} ({rb / steps / (4 * int(t['floats'])):.1f} copies); {mx / steps:.0f} ({mx / steps / (4 * int(t['floats'])):.1f} copies) |")
if sims:
    print(f"| work request latency, p50 / p99 (worst sim process) | {max(float(s['work_ms_p50']) for s in sims):.1f} / {max(float(s['work_ms_p99']) for s in sims):.1f} ms |")
    print(f"| rollout ranks' grants, pings, errors | {sum(int(s['grants']) for s in sims)}, {sum(int(s['pings']) for s in sims)}, {sum(int(s['errors']) for s in sims)} |")
print()
PY
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/summary.md"
log "summary: $OUT/summary.md"
