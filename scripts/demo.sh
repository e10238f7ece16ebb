#!/usr/bin/env bash
# The main job on its embedded defaults: GRPO on the bundled SmolLM2-135M-Instruct with the synthetic
# arithmetic task (40 steps, 4 prompts x 8 responses), under the grpod coordinator, on 2 colocated ranks
# (trainer.nnodes=1 trainer.n_gpus_per_node=2, no rollout split): each rank generates its share of every step,
# then both train data-parallel. Why this layout: bench/run_dist_bench.sh on this 2-core machine
# (docs/results/performance.md, "Distributed layouts") measured colocated at 1.16x the tokens/s of the split on-policy
# layout (2 trainers + 1 rollout rank, whose trainers idled 46% and rollout rank 71%), with each rank idle 4-6%,
# and computing what one process would (on-policy). Split one-step-off was faster still (1.20x colocated) but
# trains on rollouts one step stale, which learned worse in the demo's earlier comparison; DEMO_ROLLOUT_MODE=async
# runs it (2 trainers + 1 rollout rank, actor_rollout_ref.rollout.mode=async), DEMO_ROLLOUT_MODE=sync the split
# on-policy layout. `grpoctl workers` and `grpoctl status` are shown while it runs; at the end, the validation
# reward and exact-answer accuracy (with its standard error) before, during and after training. Installs what it
# needs, builds, fetches the model.
#
# Results: runs/grpo/demo/ (metrics.jsonl, metrics.svg, tensorboard/, checkpoints/); the status page
# of grpod while it runs at the URL printed below. A previous demo run is kept as runs/grpo/demo.prev.
#
# --task tools: the agent demo instead (docs/agents.md): multiplications of 4-5 digit numbers that the model
# answers with the calculator tool over several turns (data.synthetic.task=tool_arithmetic, multi-turn
# rollouts), results in runs/grpo/demo-tools/; the tool-call rate and accuracy are shown at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
TASK=arithmetic
while [ $# -gt 0 ]; do
    case "$1" in
    --task) TASK="${2:-}"; shift 2 || { echo "demo: --task needs arithmetic or tools" >&2; exit 2; } ;;
    --task=*) TASK="${1#--task=}"; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown argument '$1' (--task arithmetic|tools)" >&2; exit 2 ;;
    esac
done
case "$TASK" in
arithmetic) TASK_KEYS=(); run_dir=runs/grpo/demo ;;
tools)
    # the multi-turn agent demo: 2 worked examples then the question; a response holds the call, the calculator's
    # answer and the final answer (docs/agents.md). Greedy validation is right from the start on this task: it
    # samples (2 answers per held-out prompt, temperature 1), as training does. Its learning rate is 2e-5 (the default
    # is the arithmetic demo's 5e-6): it learns the tool's use in 8 steps (docs/agents.md)
    TASK_KEYS=(trainer.experiment_name=demo-tools actor_rollout_ref.actor.optim.lr=2e-5 data.synthetic.task=tool_arithmetic data.synthetic.min_digits=4
        data.synthetic.max_digits=5 'data.synthetic.ops=*' data.synthetic.num_val=32
        actor_rollout_ref.rollout.multi_turn.enable=true data.max_response_length=96 data.max_prompt_length=384
        trainer.total_training_steps=16 trainer.test_freq=8 actor_rollout_ref.rollout.val_kwargs.do_sample=true
        actor_rollout_ref.rollout.val_kwargs.n=2)
    run_dir=runs/grpo/demo-tools ;;
*) echo "demo: --task $TASK: expected arithmetic or tools" >&2; exit 2 ;;
esac
./scripts/deps.sh
./scripts/build.sh build
. scripts/blas_env.sh
# the ranks share the two cores: one compute thread each
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# mpirun as root (containers) wants explicit consent
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# the layout, in verl's names; grpod and the workers must agree
MODE="${DEMO_ROLLOUT_MODE:-colocated}"
case "$MODE" in
colocated) LAYOUT=(trainer.nnodes=1 trainer.n_gpus_per_node=2); NP=2
    WHY="2 colocated ranks: the fastest on-policy layout measured on 2 cores, 1.16x the split on-policy one's tokens/s, each rank idle 4-6% (docs/results/performance.md)" ;;
sync | async) LAYOUT=(trainer.nnodes=1 trainer.n_gpus_per_node=2 rollout.nnodes=1 rollout.n_gpus_per_node=1
    actor_rollout_ref.rollout.mode="$MODE"); NP=3
    WHY="2 trainer ranks + 1 rollout rank, rollout.mode=$MODE (DEMO_ROLLOUT_MODE=$MODE)" ;;
*) echo "demo: DEMO_ROLLOUT_MODE=$MODE: expected colocated (the default), sync or async" >&2; exit 2 ;;
esac

gguf="$(./scripts/fetch_model.sh)"
hf="$(dirname "$gguf")/SmolLM2-135M-Instruct"
if [ ! -f "$hf/config.json" ] || [ ! -f "$hf/tokenizer.json" ]; then
    echo "== converting the bundled model to the Hugging Face layout: $hf"
    build/worker/grpo-model convert "$gguf" "$hf.tmp" && rm -rf "$hf" && mv "$hf.tmp" "$hf"
fi
echo "== model: $hf"
build/worker/grpo-model info "$hf" | sed -n '1,4p;13p'

if [ -d "$run_dir" ]; then
    rm -rf "$run_dir.prev"
    mv "$run_dir" "$run_dir.prev"
fi

state="$(mktemp -d /tmp/grpo-demo.XXXXXX)"
endpoint="ipc://$state/ctl.sock"
port=$(( 20000 + RANDOM % 12000 ))  # below the kernel's ephemeral ports (32768 up), so no outgoing connection holds it
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
    grpod.http_listen="127.0.0.1:$port" "${LAYOUT[@]}" >"$state/grpod.log" 2>&1 &
grpod_pid=$!
export GRPOD_ENDPOINT="$endpoint"
for _ in $(seq 50); do build/ctl/grpoctl --retries 1 status >/dev/null 2>&1 && break; sleep 0.2; done

echo "== layout: $WHY"
echo "== training: mpirun --mca orte_enable_recovery 1 -np $NP build/worker/grpo-worker actor_rollout_ref.model.path=$hf"
echo "     ${LAYOUT[*]} grpod.endpoint=$endpoint"
[ ${#TASK_KEYS[@]} -eq 0 ] || echo "     ${TASK_KEYS[*]}"
echo "   (every other setting is the embedded default: build/worker/grpo-worker --print-config)"
# --mca orte_enable_recovery 1: in a split layout a lost rollout rank costs nothing (docs/operations.md,
# "When a rank dies")
mpirun --oversubscribe --bind-to none --mca orte_enable_recovery 1 -np "$NP" build/worker/grpo-worker \
    actor_rollout_ref.model.path="$hf" "${LAYOUT[@]}" "${TASK_KEYS[@]}" grpod.endpoint="$endpoint" &
worker_pid=$!

# grpoctl status while it runs: every 2 minutes, and once early
next=$(( SECONDS + 45 ))
while kill -0 "$worker_pid" 2>/dev/null; do
    if [ $SECONDS -ge $next ]; then
        echo "== grpoctl workers (role, coordinates, idle share of each rank)"
        build/ctl/grpoctl workers || true
        echo "== grpoctl status"
        build/ctl/grpoctl status | sed -n '1,8p' || true
        next=$(( SECONDS + 90 ))
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

nval="$(build/worker/grpo-worker --print-config "${TASK_KEYS[@]}" 2>/dev/null | awk '$1 == "num_val:" && !n { print $2; n = 1 }')"
echo "== validation (greedy, ${nval:-?} held-out prompts): reward, and exact-answer accuracy with its standard error"
python3 - "$run_dir/metrics.jsonl" "${nval:-0}" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
n = int(sys.argv[2])
def pick(r, kind):  # val-core/DS/KIND/mean@N of the (one) data source
    v = [x for k, x in r.items() if k.startswith("val-core/") and f"/{kind}/mean@" in k and x is not None]
    return v[0] if v else None
se = lambda p: math.sqrt(p * (1 - p) / n) if n > 0 else float("nan")
val = [(r["step"], pick(r, "reward"), pick(r, "acc")) for r in rows if pick(r, "reward") is not None]
for step, rw, acc in val:
    print(f"  step {step:3d}: reward {rw:.3f}" + (f", accuracy {acc:.3f} ± {se(acc):.3f}" if acc is not None else ""))
if len(val) >= 2 and val[0][2] is not None and val[-1][2] is not None:
    a0, a1 = val[0][2], val[-1][2]
    sd = math.hypot(se(a0), se(a1))
    print(f"  accuracy {a0:.3f} -> {a1:.3f} ({a1 - a0:+.3f}"
          + (f"; {(a1 - a0) / sd:.1f} standard errors of the difference" if sd > 0 else "") + ")")
tools = [r for r in rows if "multi_turn/tool_call_rate" in r]
if len(tools) >= 6:  # the agent demo: how often the model called the tool, and how often it then answered right
    k = len(tools) // 3
    mean = lambda rs, key: sum(r.get(key) or 0 for r in rs) / len(rs)
    for name, rs in (("first", tools[:k]), ("last", tools[-k:])):
        print(f"  tools, steps {rs[0]['step']}-{rs[-1]['step']}: tool-call rate {mean(rs, 'multi_turn/tool_call_rate'):.2f}, "
              f"tool errors per answer {mean(rs, 'multi_turn/tool_errors/mean'):.2f}, "
              f"accuracy {mean(rs, 'critic/acc/mean'):.2f}, turns {mean(rs, 'num_turns/mean'):.2f}")
train = [r for r in rows if "critic/score/mean" in r]
if len(train) >= 6:
    k = len(train) // 3
    mean = lambda rs, key: sum(r.get(key) or 0 for r in rs) / len(rs)
    first, last = train[:k], train[-k:]
    print(f"  training (critic/score/mean, critic/acc/mean): steps {first[0]['step']}-{first[-1]['step']} "
          f"{mean(first, 'critic/score/mean'):.3f}, {mean(first, 'critic/acc/mean'):.3f}; steps "
          f"{last[0]['step']}-{last[-1]['step']} {mean(last, 'critic/score/mean'):.3f}, {mean(last, 'critic/acc/mean'):.3f}")
steps = [r for r in rows if r["step"] >= 2 and "timing_s/step" in r]
if steps:
    mean = lambda k: sum(r.get(k, 0) for r in steps) / len(steps)
    head = f"== where the time went (steps 2-{steps[-1]['step']}): step {mean('timing_s/step'):.1f} s"
    if "colocated/units" in steps[0]:  # every rank generates and trains: a rank's idle is its wait for peers
        val_steps = {r["step"] for r in rows if "timing_s/testing" in r}
        plain = [r for r in steps if r["step"] - 1 not in val_steps] or steps
        after = [r for r in steps if r["step"] - 1 in val_steps]
        pm = lambda rs, k: sum(r.get(k, 0) for r in rs) / len(rs)
        print(f"{head}, generation {mean('timing_s/gen'):.1f} s, update {mean('timing_s/update_actor'):.1f} s; "
              f"each rank idle (waiting for its peer) {pm(plain, 'perf/idle_ratio/mean'):.1%} on average, "
              f"{pm(plain, 'perf/idle_ratio/max'):.1%} on the idler rank"
              + (f"; in the {len(after)} steps after a validation (rank 0 validates, rank 1 waits) "
                 f"{pm(after, 'perf/idle_ratio/max'):.0%} on the idler rank" if after else ""))
    else:
        print(f"{head}, trainer idle {mean('trainer/idle_ratio'):.0%}, rollout idle {mean('rollouter/idle_ratio'):.0%}, "
              f"weight sync {mean('timing_s/update_weights'):.2f} s")
PY
echo "== results in $run_dir: metrics.jsonl, metrics.svg (chart), tensorboard/ (tensorboard --logdir $run_dir/tensorboard), checkpoints/"
